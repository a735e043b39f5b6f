"""tideflow.bus."""
