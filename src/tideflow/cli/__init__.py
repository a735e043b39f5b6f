"""tideflow.cli."""
