"""tilewise.tune."""
