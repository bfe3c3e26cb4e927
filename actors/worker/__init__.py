"""What runs in a worker process (``python -m actors.worker.main``): its IO thread,
one session actor per live session, the agents and the tools they call.

Kept empty: the host imports a few pure functions from here (the sandbox probe,
the agents' config checks, the shell's environment rules) and nothing else.
"""
