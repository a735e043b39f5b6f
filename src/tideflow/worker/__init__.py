"""tideflow.worker."""
