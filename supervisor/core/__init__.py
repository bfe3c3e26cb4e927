"""The loop's tables: live sessions, routes, pacing, turns, owners, counters. Imports: config."""
