"""The README's Python API names, in every import order: `vggserve.VGG16` is the class and `vggserve.preprocess`
is the function, also after something imported the module that used to be called `vggserve.preprocess`
(now `vggserve.preprocessing`, with the old name kept as an alias of it). Each order runs in a fresh interpreter,
since imports are cached per process."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# ways a program (or vggserve itself) may reach the names, each one import statement
IMPORTS = (
    "from vggserve import VGG16",
    "from vggserve import preprocess",
    "import vggserve.preprocess",
    "from vggserve.preprocess import center_crop",
    "import vggserve.preprocessing",
    "import vggserve.model.vgg16",
    "import vggserve.ipc.shm",  # a module of ours that imports the preprocessing module as it loads
)

CHECK = textwrap.dedent("""
    import sys, types
    from PIL import Image
    for statement in sys.argv[1:]:
        exec(statement, {})
        import vggserve
        from vggserve import VGG16, preprocess
        import vggserve.model.vgg16
        assert isinstance(preprocess, types.FunctionType), (statement, preprocess)
        assert vggserve.preprocess is preprocess is vggserve.preprocessing.preprocess, statement
        assert VGG16 is vggserve.VGG16 is vggserve.model.vgg16.VGG16, statement
        assert preprocess(Image.new("RGB", (300, 260))).shape == (3, 224, 224), statement
        from vggserve.preprocess import center_crop
        assert center_crop is vggserve.preprocessing.center_crop, statement
        assert sys.modules["vggserve.preprocess"] is vggserve.preprocessing, statement
    print("ok")
""")


def orders():
    """Every statement first, then the others forwards and backwards."""
    for i, first in enumerate(IMPORTS):
        rest = IMPORTS[:i] + IMPORTS[i + 1:]
        yield pytest.param((first, *rest), id=f"first{i}-forwards")
        yield pytest.param((first, *reversed(rest)), id=f"first{i}-backwards")


@pytest.mark.parametrize("order", list(orders()))
def test_public_names_are_the_class_and_the_function_in_any_import_order(order):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", CHECK, *order], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_readme_api_line_gives_a_callable_preprocess():
    """README: `from vggserve import VGG16, preprocess` then `preprocess(pil_image)`, in a fresh interpreter."""
    code = ("from vggserve import VGG16, preprocess\nfrom PIL import Image\n"
            "print(preprocess(Image.new('L', (500, 300))).shape)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "(3, 224, 224)"
