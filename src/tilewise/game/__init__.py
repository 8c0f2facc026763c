"""tilewise.game."""
