"""Commands an operator types in a shell, measured as a user has them: from a wheel install.

The script builds the wheel of this checkout, installs it (with the ``postgres`` extra) into a
fresh venv in a scratch directory, so that nothing is compiled at run time, and runs the
venv's own ``haltwise`` script, exactly as a shell would (issue 35, item 3):

- exec to exit, wall and CPU (user + system, from the kernel's accounting of the ended child):
  ``haltwise cancel ID`` of an unknown id, ``haltwise status ID`` and ``haltwise pause ID`` of a
  completed run, ``haltwise approve ID STEP`` if the installed command line has it; beside them,
  in the same run, the floor: a bare interpreter of the venv and ``import haltwise._cli``;
- exec to the tool interrupted: ``haltwise cancel ID`` of a run waiting in an interruptible tool
  in another process (the venv's interpreter runs ``_cancel_target.py``), the target's figure
  (p95 under 120 ms);
- what each command imports (``python -X importtime``): whether asyncio, anyio, rich, pydantic,
  starlette, psycopg are loaded, and the cumulative import time of the largest ones (a breakdown).

Each figure is a median and a p95 over ``--trials`` runs after one warm-up; the load average is
printed before and after each row. SQLite; ``--postgres`` adds the PostgreSQL rows (a throwaway
server from tests/_pg.py).

usage: python bench/bench_command.py [--trials N] [--postgres] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from _report import header, median, percentile, read_event, table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: runs of each command under ``-X importtime``
IMPORT_RUNS = 7
#: the packages whose import the light commands should not pay for, and the ones they need
WATCHED = ("asyncio", "anyio", "click", "sqlite3", "rich", "pydantic", "starlette", "psycopg")


def load() -> str:
    """The 1-minute load average."""
    return Path("/proc/loadavg").read_text().split()[0]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def exec_to_exit(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """One process from exec to its exit: wall seconds, CPU seconds, exit code."""
    before = children_cpu()
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, env=env, check=False)
    return time.perf_counter() - start, children_cpu() - before, done.returncode


def install(scratch: Path) -> Path:
    """Build this checkout's wheel and install it into a fresh venv; return the venv's bin."""
    wheels = scratch / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        check=True,
    )
    (wheel,) = wheels.glob("haltwise-*.whl")
    venv = scratch / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", f"{wheel}[postgres]"],
        check=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    return venv / "bin"


def plain_env() -> dict[str, str]:
    """The environment a shell gives a command: no PYTHONPATH, bytecode read as installed."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    env.pop("HALTWISE_STORE", None)
    return env


def seed_store(bin_dir: Path, url: str) -> None:
    """One completed run ``done`` (one step), made by the installed package."""
    code = (
        "import anyio, haltwise\n"
        "@haltwise.tool(cancel='interruptible', effect='read')\n"
        "async def look(x: int) -> int:\n    return x\n"
        "@haltwise.task(name='bench:done')\n"
        "async def flow() -> int:\n    return await look(1)\n"
        "async def main():\n"
        f"    async with haltwise.Runtime({url!r}) as rt:\n"
        "        await (await rt.start(flow, task_id='done')).outcome()\n"
        "anyio.run(main)\n"
    )
    subprocess.run([str(bin_dir / "python"), "-c", code], check=True, env=plain_env())


def has_command(bin_dir: Path, name: str) -> bool:
    done = subprocess.run(
        [str(bin_dir / "haltwise"), name, "--help"], capture_output=True, env=plain_env()
    )
    return done.returncode == 0


def exits(argvs: dict[str, list[str]], trials: int) -> list[list[object]]:
    rows: list[list[object]] = []
    env = plain_env()
    for what, argv in argvs.items():
        exec_to_exit(argv, env)  # warm-up: the page cache, the venv's first run
        before = load()
        walls, cpus, codes = zip(*(exec_to_exit(argv, env) for _ in range(trials)), strict=True)
        rows.append(
            [
                what,
                trials,
                ms(median(walls)),
                ms(percentile(walls, 0.95)),
                ms(median(cpus)),
                ms(percentile(cpus, 0.95)),
                ",".join(sorted({str(code) for code in codes})),
                f"{before} / {load()}",
            ]
        )
    return rows


def to_interrupted(bin_dir: Path, url: str, trials: int) -> list[object]:
    """``haltwise cancel xI`` exec -> the tool of run xI interrupted in the target process."""
    env = plain_env()
    target = subprocess.Popen(
        [str(bin_dir / "python"), str(HERE / "_cancel_target.py"), url, str(trials + 1)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    walls, cpus = [], []
    before = load()
    try:
        for i in range(trials + 1):
            read_event(target, "entered")
            time.sleep(0.05)
            cpu = children_cpu()
            sent = time.time()
            subprocess.run(
                [str(bin_dir / "haltwise"), "cancel", f"x{i}", "--store", url],
                check=True,
                capture_output=True,
                env=env,
            )
            spent = children_cpu() - cpu
            stopped = float(read_event(target, "stopped")[2])
            read_event(target, "final")
            if i:  # the first is the warm-up
                walls.append(stopped - sent)
                cpus.append(spent)
        target.wait(timeout=30)
    finally:
        if target.poll() is None:
            target.kill()
    return [
        "haltwise cancel ID: exec -> tool interrupted",
        trials,
        ms(median(walls)),
        ms(percentile(walls, 0.95)),
        ms(median(cpus)),
        ms(percentile(cpus, 0.95)),
        "0",
        f"{before} / {load()}",
    ]


def imports(bin_dir: Path, argv: list[str]) -> list[str]:
    """What ``argv`` (run under ``-X importtime``) spends importing, in ms of self time summed
    per package: the whole process, haltwise's own modules, and each of :data:`WATCHED` (with
    everything of its name, such as anyio's lazily imported ``anyio._core`` modules), or "-"
    where the package is not imported at all. Each module's time is its least over
    :data:`IMPORT_RUNS` runs (what it costs when nothing else gets in the way)."""
    spent: dict[str, int] = {}
    for _ in range(IMPORT_RUNS):
        done = subprocess.run(
            [str(bin_dir / "python"), "-X", "importtime", "-m", "haltwise", *argv],
            capture_output=True,
            text=True,
            env=plain_env(),
        )
        for line in done.stderr.splitlines():
            if not line.startswith("import time:") or "|" not in line:
                continue
            own, _, name = (part.strip() for part in line.removeprefix("import time:").split("|"))
            if own.isdigit():
                spent[name] = min(int(own), spent.get(name, int(own)))

    def of(package: str) -> str:
        times = [t for name, t in spent.items() if name.split(".")[0].lstrip("_") == package]
        return f"{sum(times) / 1000:.0f}" if times else "-"

    return [f"{sum(spent.values()) / 1000:.0f}", of("haltwise"), *(of(name) for name in WATCHED)]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


@contextmanager
def postgres_url() -> Iterator[str]:
    sys.path.insert(0, str(ROOT / "tests"))
    from _pg import PostgresServer, create_database

    server = PostgresServer()
    server.start()
    try:
        yield create_database(server.dsn)
    finally:
        server.stop()


def measure(bin_dir: Path, name: str, url: str, trials: int) -> None:
    seed_store(bin_dir, url)
    haltwise = str(bin_dir / "haltwise")
    argvs = {
        "bare interpreter: python -c pass": [str(bin_dir / "python"), "-c", "pass"],
        "python -c 'import haltwise._cli'": [
            str(bin_dir / "python"),
            "-c",
            "import haltwise._cli",
        ],
        "haltwise cancel ID (unknown id)": [haltwise, "cancel", "nope", "--store", url],
        "haltwise status ID (a completed run)": [haltwise, "status", "done", "--store", url],
        "haltwise pause ID (a completed run)": [haltwise, "pause", "done", "--store", url],
    }
    if has_command(bin_dir, "approve"):
        argvs["haltwise approve ID STEP (unknown id)"] = [
            haltwise,
            "approve",
            "nope",
            "0",
            "--store",
            url,
        ]
    rows = exits(argvs, trials)
    rows.append(to_interrupted(bin_dir, url, trials))
    print(f"### {name}\n")
    heads = ["what", "trials", "wall p50", "wall p95", "CPU p50", "CPU p95", "exit", "load"]
    print(table(heads, rows))
    print("\nWhat each command imports, ms of import time (-X importtime, self times summed")
    print("per package, each module's least of 7 runs; '-': not imported; a breakdown):\n")
    light = {
        "cancel ID": ["cancel", "nope", "--store", url],
        "status ID": ["status", "done", "--store", url],
        "pause ID": ["pause", "done", "--store", url],
    }
    heads = ["command", "all", "haltwise", *WATCHED]
    print(table(heads, [[what, *imports(bin_dir, argv)] for what, argv in light.items()]))
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--postgres", action="store_true", help="add the PostgreSQL rows")
    parser.add_argument("--keep", type=Path, help="build and install here, and keep it")
    args = parser.parse_args()
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        run(args.keep, args.trials, args.postgres)
        return
    with tempfile.TemporaryDirectory(prefix="hw-bench-command-") as scratch:
        run(Path(scratch), args.trials, args.postgres)


def run(scratch_root: Path, trials: int, postgres: bool) -> None:
    """Build, install and measure in ``scratch_root``."""
    revision = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(header("Commands typed in a shell, from a wheel install"))
    print(f"- revision: {revision} (the wheel of this checkout, in a fresh venv)")
    print(f"- load before building: {Path('/proc/loadavg').read_text().strip()}\n")
    bin_dir = install(scratch_root)
    measure(bin_dir, "SQLite", f"sqlite:///{scratch_root}/store.db", trials)
    if postgres:
        with postgres_url() as url:
            measure(bin_dir, "PostgreSQL", url, trials)


if __name__ == "__main__":
    main()
