"""The built ampforge wheel serves ``from apex import amp`` in a fresh venv, and shares the venv
with another distribution that owns ``apex/`` (NVIDIA apex, Ascend's ``apex-0.1+ascend``).

The wheel has no top-level ``apex/``: its ``ampforge-apex.pth`` appends ``amp/_shim`` to
``sys.path``. So pip never writes into the other distribution's files, uninstalling either one
leaves the other whole, and while the other is installed it wins the ``apex`` name (the site
directory comes before the paths its ``.pth`` files add) while ``import amp`` stays ampforge.
The other distribution here is a real wheel named ``apex``, version ``0.1+ascend``.

The wheel is the host backend's build of this checkout (the session fixture that
test_wheel_e2e.py checks), installed without dependencies; torch comes from the test
environment through a ``.pth`` entry (installed once, not copied).
"""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

from helpers.indexlib import fresh_venv, make_wheel, pip_in
from helpers.pipelinelib import AmpBuild

# What a user's script does with the apex names, then one O1 training step through them.
USER_SCRIPT = """
import apex, amp, torch
from apex import amp as apex_amp
from apex.amp import _amp_state
from apex.optimizers import FusedAdam, FusedSGD
from apex.parallel import LARC
from apex.contrib.combine_tensors import combine_npu
from apex.dump import HookerAndDumper
assert apex_amp is amp and _amp_state is amp._amp_state, "apex.amp is not amp"
assert all(getattr(apex.optimizers, n) is getattr(amp.optimizers, n)
           for n in amp.optimizers.__all__)
model = torch.nn.Linear(4, 1)
opt = FusedSGD(model.parameters(), lr=0.1)
model, opt = apex_amp.initialize(model, opt, opt_level="O1", verbosity=0)
with apex_amp.scale_loss(model(torch.ones(2, 4)).sum(), opt) as scaled:
    scaled.backward()
opt.step()
print("ampforge apex", amp.__file__)
"""

# Which apex answers, and where amp lives (found, not imported: no torch import, seconds saved).
WHO_HAS_APEX = (
    "import apex, importlib.util as u; print(getattr(apex, 'VERSION', 'ampforge'), "
    "'amp:', u.find_spec('amp').origin)"
)


def _python(python: Path, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # cwd outside the checkout: '' on sys.path must not find the checkout's amp/.
    return subprocess.run(
        [str(python), "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def _installed(python: Path, dist: str, cwd: Path) -> set[str]:
    code = (
        f"import importlib.metadata as m; print('\\n'.join(str(f) for f in "
        f"m.distribution({dist!r}).files))"
    )
    r = _python(python, code, cwd)
    assert r.returncode == 0, r.stderr
    return {line for line in r.stdout.splitlines() if ".dist-info/" not in line}


def test_the_wheel_serves_apex_and_coexists_with_another_apex(
    host_amp_build: AmpBuild, tmp_path: Path
) -> None:
    wheel = host_amp_build.wheel
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert "ampforge-apex.pth" in names and "amp/_shim/apex/__init__.py" in names
    assert not [n for n in names if n.startswith("apex/")], "a top-level apex/ collides"
    other = make_wheel(tmp_path / "other", "apex", "0.1+ascend")
    python = fresh_venv(tmp_path / "venv", see_outer_packages=True)

    r = pip_in(python, "install", "--no-deps", str(wheel))
    assert r.returncode == 0, r.stderr
    r = _python(python, USER_SCRIPT, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ampforge apex" in r.stdout and str(tmp_path / "venv") in r.stdout, r.stdout

    # The other apex installs beside it: no file of one is a file of the other ...
    r = pip_in(python, "install", "--no-deps", str(other))
    assert r.returncode == 0, r.stderr
    assert "apex/__init__.py" in _installed(python, "apex", tmp_path)
    assert not _installed(python, "apex", tmp_path) & _installed(python, "ampforge", tmp_path)
    # ... and wins the apex name, while amp stays ampforge's.
    r = _python(python, WHO_HAS_APEX, tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("0.1+ascend amp: "), r.stdout + r.stderr
    assert str(tmp_path / "venv") in r.stdout

    # Uninstalling the other gives the name back to ampforge, which is intact ...
    r = pip_in(python, "uninstall", "--yes", "apex")
    assert r.returncode == 0, r.stderr
    r = _python(python, WHO_HAS_APEX, tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("ampforge amp: "), r.stdout + r.stderr

    # ... and uninstalling ampforge leaves the other apex whole.
    assert pip_in(python, "install", "--no-deps", str(other)).returncode == 0
    r = pip_in(python, "uninstall", "--yes", "ampforge")
    assert r.returncode == 0, r.stderr
    r = _python(python, "import apex; print(apex.VERSION)", tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "0.1+ascend", r.stdout + r.stderr
    r = _python(python, "import importlib.util as u; print(u.find_spec('amp'))", tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "None", r.stdout + r.stderr
