"""The build backend of `pip install .`: scikit-build-core, once the python3 that runs pip has what the build needs.

    python3 -m pip install --no-build-isolation .      (pyproject.toml names this module)

The extension is compiled against the torch it will be imported with, so pip
runs without build isolation and cannot fetch the build's requirements itself.
Without this check a missing scikit-build-core ends pip in a long traceback,
and a missing torch is found only by CMake, after pip has resolved the
project's dependencies (torch and its CUDA wheels, gigabytes). Here the first
hook pip calls looks for them (find_spec: nothing is imported, so it takes
milliseconds) and refuses in one line that names what is missing and the order
to install it in. A source distribution needs scikit-build-core only.
"""
import importlib.util
import shutil
import sys

# (module, what pip calls it, how to install it), in the order to install them.
TORCH = ("torch", "torch", "install torch first (the wheel for this Python and CUDA: https://pytorch.org/get-started/locally/)")
SKBUILD = ("scikit_build_core", "scikit-build-core", "python3 -m pip install 'scikit-build-core>=0.11'")
TOOL = "python3 -m pip install ninja (or install make)"


def found(module):
    return importlib.util.find_spec(module) is not None


def build_tool_found():
    return bool(shutil.which("ninja") or shutil.which("make") or found("ninja"))


def refusal(wheel, find=found, tool_found=build_tool_found):
    """The one line that refuses the build, or '' when the build has what it needs.

    wheel: a wheel (or editable) build, which needs torch and ninja or make; an sdist needs only scikit-build-core.
    """
    needs = [(name, how) for module, name, how in ((TORCH, SKBUILD) if wheel else (SKBUILD,)) if not find(module)]
    if wheel and not tool_found():
        needs.append(("ninja or make", TOOL))
    if not needs:
        return ""
    names = " and ".join(name for name, _ in needs)
    steps = "; then ".join(how for _, how in needs)
    return (f"attnlab: building needs {names}, which {sys.executable} has not got: {steps}; "
            "then rerun python3 -m pip install --no-build-isolation .")


def _backend(wheel):
    line = refusal(wheel)
    if line:
        raise SystemExit(line)  # pip's hook runner prints it to stderr and exits 1
    import scikit_build_core.build
    return scikit_build_core.build


def get_requires_for_build_wheel(config_settings=None):
    return _backend(True).get_requires_for_build_wheel(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _backend(True).prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _backend(True).build_wheel(wheel_directory, config_settings, metadata_directory)


def get_requires_for_build_editable(config_settings=None):
    return _backend(True).get_requires_for_build_editable(config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _backend(True).prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _backend(True).build_editable(wheel_directory, config_settings, metadata_directory)


def get_requires_for_build_sdist(config_settings=None):
    return _backend(False).get_requires_for_build_sdist(config_settings)


def build_sdist(sdist_directory, config_settings=None):
    return _backend(False).build_sdist(sdist_directory, config_settings)


if __name__ == "__main__":  # python3 python/backend/attnlab_backend.py: would a wheel build start?
    print(refusal(True) or f"attnlab: {sys.executable} has torch, scikit-build-core and a build tool")
