"""tideflow.store.backends."""
