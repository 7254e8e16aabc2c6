"""Build hooks of the cohort package (metadata lives in pyproject.toml).

The package loads libcohort.so at run time. To make an installed package
use the library it was built with, the build copies that library into
cohort/_lib/: the one named by $COHORT_LIBRARY at install time, else the
first of <repo>/build/lib, <repo>/build-ffi/lib found next to this source
tree. Without either, the package is pure Python and finds the library at
run time ($COHORT_LIBRARY or the system's search path). The torch backend's
module (_c10d, built where torch's headers are) is bundled beside it when it
sits next to that library, or $COHORT_TORCH_EXT names it.

    COHORT_LIBRARY=$PWD/build/lib/libcohort.so \
        python3 -m pip install --no-deps --no-build-isolation ./ffi/python
"""
import glob
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def built_library():
    env = os.environ.get("COHORT_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise SystemExit("COHORT_LIBRARY=%s: no such file" % env)
        return env
    repo = os.path.dirname(os.path.dirname(HERE))
    for d in ("build", "build-ffi"):
        p = os.path.join(repo, d, "lib", "libcohort.so")
        if os.path.isfile(p):
            return p
    return None


def built_torch_extension(lib):
    """The torch.distributed backend's module (_c10d) built with lib: from
    $COHORT_TORCH_EXT, else beside lib (build/lib); None without one."""
    env = os.environ.get("COHORT_TORCH_EXT")
    if env:
        return env if os.path.isfile(env) else None
    if not lib:
        return None
    found = sorted(glob.glob(os.path.join(os.path.dirname(lib), "_c10d*.so")))
    return found[0] if found else None


class BuildPy(build_py):
    def run(self):
        super().run()
        lib = built_library()
        if lib:
            dest = os.path.join(self.build_lib, "cohort", "_lib")
            os.makedirs(dest, exist_ok=True)
            shutil.copyfile(lib, os.path.join(dest, "libcohort.so"))  # follows the symlinks
            print("cohort: bundling %s" % lib)
            ext = built_torch_extension(lib)
            if ext:  # cohort.torch loads it after the bundled libcohort (same soname)
                shutil.copyfile(ext, os.path.join(dest, os.path.basename(ext)))
                print("cohort: bundling the torch backend %s" % ext)
        else:
            print("cohort: no libcohort.so to bundle; set COHORT_LIBRARY at run time")


class PlatformDist(Distribution):
    """With a bundled .so the wheel is for this platform, not any."""

    def has_ext_modules(self):
        return built_library() is not None


setup(cmdclass={"build_py": BuildPy}, distclass=PlatformDist)
