"""Settings and the paths they name (main thread, then immutable). Imports: none of supervisor."""
