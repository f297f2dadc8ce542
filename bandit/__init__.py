"""specbandit analysis: block logs in, every headline number with a 95% bootstrap CI out.

This package is `bandit` inside the `specbandit` distribution. An unrelated PyPI package
(the PyCQA security linter) is also called `bandit`: do not install both in one environment.
"""

__version__ = "0.1.0"
