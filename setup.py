"""The one thing pyproject.toml cannot say: varstore's optional C extension.

`optional=True`: where it does not compile (no compiler, no Python headers), the
install still succeeds and varstore runs its pure-Python paths (varstore/_native.py).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("varstore._speedups", ["varstore/_speedups.c"], optional=True, extra_compile_args=["-O3"])])
