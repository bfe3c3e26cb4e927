"""Worker processes: the pool, their env and socket, the SupervisorActor. Imports: core, config."""
