"""tideflow.runtime."""
