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


def mixed_install(package_dir: str) -> str | None:
    """A warning's text when upstream's ``loaderx`` distribution is installed
    beside this one (in the folder that holds ``package_dir``), else None.

    Both install the ``loaderx/`` package, so its files are then a mix of the
    two; pip cannot declare the conflict. Costs one ``listdir``.
    """
    import os

    site = os.path.dirname(os.path.abspath(package_dir))
    try:
        names = os.listdir(site)
    except OSError:
        return None
    ours = any(n.startswith("loaderx_engine-") and n.endswith(".dist-info") for n in names)
    theirs = sorted(n[len("loaderx-") : -len(".dist-info")] for n in names
                    if n.startswith("loaderx-") and n.endswith(".dist-info"))
    if not (ours and theirs):
        return None
    return (f"{DISTRIBUTION} and upstream's loaderx {', '.join(theirs)} are both installed in {site}: "
            f"both install the loaderx package, whose files are now a mix of the two. Run "
            f"`pip uninstall -y loaderx {DISTRIBUTION} && pip install {DISTRIBUTION}` (docs/compat.md, "
            f"\"Installing\")")
