"""Real vendor ACP adapters (from npm) against local fakes of their vendors' APIs, driven
directly and through zeroclaw by the same editor-like client (issue 22)."""
