"""tideflow.store."""
