"""tideflow.model."""
