"""End-to-end tests: real ``zeroclaw acp`` processes driven by real clients."""
