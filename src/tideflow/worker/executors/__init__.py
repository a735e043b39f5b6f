"""tideflow.worker.executors."""
