"""The analysis layer: oracle traces, the what-if simulator, sweeps, calibration and metrics (numpy only)."""
