"""The host process in packages, each importing only those after it in this order:
``cli`` → ``servers`` → ``ops`` → ``host`` → ``hosted`` → ``workers`` → ``core`` → ``config``.

Below every one of them: ``ipc``, ``actors``, ``storage``, which never import ``supervisor``
(the version is :mod:`ipc.version`). ``tests/test_import_rules.py`` holds the rules.
"""
