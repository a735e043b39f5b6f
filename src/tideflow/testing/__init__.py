"""tideflow.testing."""
