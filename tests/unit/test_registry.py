"""Every registered kernel family loads without a GPU library and has a space the CLI can default to."""

import pytest

from tilewise.kernels.registry import TEMPLATES, get_template


@pytest.mark.parametrize("kernel,backend", sorted(TEMPLATES))
def test_registered_templates_load_and_default_space_exists(kernel, backend):
    tpl = get_template(kernel, backend)
    assert tpl.backend == backend
    name = tpl.default_space()
    assert name in tpl.space_names()
    space = tpl.space(name)
    assert space.size >= 1
    assert len(tpl.shape_names) >= 1
