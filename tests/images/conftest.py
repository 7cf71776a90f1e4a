from __future__ import annotations

import pytest
import typer

from nvrx_eks.images.commands import register


@pytest.fixture
def image_app() -> typer.Typer:
    """`nvrx-eks` with the image commands alone, for typer's test runner."""
    app = typer.Typer()
    image = typer.Typer()
    app.add_typer(image, name="image")
    register(image=image)
    return app
