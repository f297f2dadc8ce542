"""Only the optional compiled extensions; everything else is in pyproject.toml.

`pip install -e .` compiles them next to their sources where a C compiler and the Python
headers exist; where they do not, the install still succeeds and the pure-Python paths run
instead, with the same results, slower:

  bandit._colparse         (bandit/_colparse.c): the block-log parser of bandit/fastload.py;
                           without it logs are read with pyarrow, else orjson / json
  bandit._resample_kernel  (bandit/_resample_kernel.c): the packed run sums of bandit/resample.py;
                           without it, numpy
"""
from setuptools import Extension, setup

setup(ext_modules=[
    Extension("bandit._colparse", ["bandit/_colparse.c"], optional=True),
    Extension("bandit._resample_kernel", ["bandit/_resample_kernel.c"], optional=True),
])
