"""The Host assembled, and session operations for all dialects. Imports: hosted and below."""
