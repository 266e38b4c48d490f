"""The one part of `pip install .` that pyproject.toml cannot say: the
extension nanscope._nanscope is built by this repository's CMake (the target
nanscope_python and the libraries it links; no tests, benchmarks or viewer),
against the LibTorch of the torch this Python imports, and copied into the
package. CMAKE_ARGS (the environment variable other CMake-built Python
packages read too) adds options to that configure, in shell quoting:
CMAKE_ARGS="-DNANSCOPE_TORCH_PCH=OFF" pip install ."""
import os
import shlex
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCE = Path(__file__).resolve().parent


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        import torch  # the torch the extension is for; its LibTorch is the one linked

        # One level below the source, as the lanes' build/ is: ccache makes the
        # include paths relative to the build folder, so only at the same depth
        # do these compiles match the objects a build of the tree already made
        # (setuptools' build/temp.*/cmake, three levels down, never did).
        build = SOURCE / ("build-" + Path(self.build_temp).name.removeprefix("temp."))
        build.mkdir(parents=True, exist_ok=True)
        configure = ["cmake", "-S", str(SOURCE), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                     f"-DPython3_EXECUTABLE={sys.executable}", f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                     "-DNANSCOPE_BUILD_TESTS=OFF", "-DNANSCOPE_BUILD_BENCH=OFF", "-DNANSCOPE_BUILD_VIEWER=OFF"]
        configure += shlex.split(os.environ.get("CMAKE_ARGS", ""))
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        print(f"nanscope: building the extension with CMake in {build} ({jobs} jobs)", flush=True)
        subprocess.run(configure, check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", str(build), "--target", "nanscope_python", "-j", jobs], check=True)
        built = sorted((build / "python" / "nanscope").glob("_nanscope*.so"))
        if not built:
            sys.exit(f"nanscope: CMake built no extension (no Python module: see {build}/CMakeCache.txt; it needs "
                     "python3-dev, pybind11-dev and a torch whose version is LibTorch's)")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        self.copy_file(str(built[0]), str(target))


setup(ext_modules=[Extension("nanscope._nanscope", sources=[])], cmdclass={"build_ext": CMakeBuild})
