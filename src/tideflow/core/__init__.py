"""tideflow.core."""
