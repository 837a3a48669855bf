"""What a run shows in the terminal."""
