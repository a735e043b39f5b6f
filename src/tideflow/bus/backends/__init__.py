"""tideflow.bus.backends."""
