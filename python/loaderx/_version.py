"""The name and version of this implementation, written here and nowhere else.

pyproject.toml reads ``__version__`` (scikit-build-core's regex provider),
CMakeLists.txt reads it into ``PROJECT_VERSION`` (``loaderxd --version``, the
daemon's status and ``hello``, the client's ``hello``, a store's ``writer``),
and ``loaderx.__version__`` and ``loaderx --version`` import it. The
distribution is ``loaderx-engine`` (it provides the ``loaderx`` import package
of the 2.5.4 API; docs/compat.md, "Installing"). The version is this
implementation's own, not upstream loaderx's.
"""

DISTRIBUTION = "loaderx-engine"
__version__ = "0.1.0"
