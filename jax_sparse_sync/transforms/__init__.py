"""The Optax gradient transformations (residual state, selection policy, telemetry)."""
