"""No kernel template inherits from another backend's: a class under tilewise.kernels that derives from a
KernelTemplate subclass derives only from ones of its own backend (two backends of a family share their problem
object, nothing else). A base that states no backend (a family's backend-neutral template) counts as another's."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import tilewise.kernels
from tilewise.kernels.base import KernelTemplate


def _template_classes() -> list[type[KernelTemplate]]:
    found = []
    for info in pkgutil.walk_packages(tilewise.kernels.__path__, tilewise.kernels.__name__ + "."):
        module = importlib.import_module(info.name)
        found += [cls for cls in vars(module).values()
                  if inspect.isclass(cls) and issubclass(cls, KernelTemplate) and cls.__module__ == module.__name__
                  and cls is not KernelTemplate]
    return found


def test_no_template_inherits_from_another_backends_template():
    classes = _template_classes()
    names = {cls.__name__ for cls in classes}
    assert {"WgslGemm", "CudaGemm", "TvmCudaGemm", "WgslConv1d", "TvmConv1d", "TvmCudaConv1d", "WgslDwsepConv2d",
            "TvmCudaDwsepConv2d"} <= names
    crossing = [(cls.__module__, cls.__name__, cls.backend, base.__name__, base.backend)
                for cls in classes for base in cls.__mro__[1:]
                if issubclass(base, KernelTemplate) and base is not KernelTemplate and base.backend != cls.backend]
    assert crossing == []
