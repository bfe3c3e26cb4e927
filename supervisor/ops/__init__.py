"""What operators read: status, /metrics, the daemon's heap. Imports: host and everything below."""
