"""tideflow.dsl."""
