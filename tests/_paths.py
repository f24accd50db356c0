"""Where the tests' own files are, for test modules in any subfolder of ``tests/``.

Test modules live in folders that mirror ``src/haltwise``'s layers (``tests/runtime``,
``tests/cli``, ...); the agents, kits and fixtures they run stay in ``tests/`` itself, which is
on ``sys.path`` (``pythonpath`` in pyproject.toml).
"""

from pathlib import Path

#: ``tests/``: the agents, kits and fixtures the test modules run.
TESTS = Path(__file__).resolve().parent
#: The repository's root (``pyproject.toml``, ``examples/``, ``docs/``).
ROOT = TESTS.parent
