"""tideflow."""
