"""The wheel carries every file kimictl reads at run time: each file git tracks under kimictl/
(profiles, data, the TUI's stylesheet, the helper scripts the launcher runs) is in the wheel
that `pip wheel .` builds, and the shipped profiles are found through the package, not the tree.
scripts/check-wheel (run by CI) installs that wheel into a new venv and runs it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    # built from a copy of the tracked files: a build in the checkout leaves kimictl.egg-info
    # there, which then answers entry-point lookups for whatever puts the checkout on sys.path
    tracked = _tracked(".")
    if not tracked:
        pytest.skip("not a git checkout")
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in tracked:
        if (ROOT / name).exists() or (ROOT / name).is_symlink():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name, follow_symlinks=False)
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    (wheel,) = out.glob("kimictl-*.whl")
    with zipfile.ZipFile(wheel) as z:
        return set(z.namelist())


def _tracked(prefix: str) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", prefix], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    return [line for line in out.splitlines() if line]


def test_every_tracked_package_file_is_in_the_wheel(wheel_names: set[str]):
    tracked = _tracked("kimictl")
    missing = [f for f in tracked if f not in wheel_names]
    assert not missing, f"files kimictl ships but the wheel lacks: {missing}"
    assert any(n.startswith("kimictl/profiles/") and n.endswith(".toml") for n in wheel_names)


def test_top_level_profiles_is_the_shipped_folder():
    # readers find profiles/ at the top; the package finds the same files through itself
    from kimictl.deployment.profiles import shipped_profiles_dir

    shipped = shipped_profiles_dir()
    assert shipped.resolve() == (ROOT / "profiles").resolve()
    assert shipped.is_relative_to(ROOT / "kimictl")
    assert (shipped / "cpu-demo.toml").is_file()
