"""docs/reference/settings.md: every field of Settings, from its declaration."""

from __future__ import annotations

from shipyard.reference.fields import bounds, default, meaning, type_name
from shipyard.reference.markdown import code, first_paragraph, page, table
from shipyard.settings import Settings


def render() -> str:
    prefix = Settings.model_config.get("env_prefix", "")
    rows = []
    for name, field in Settings.model_fields.items():
        rows.append(
            (
                code(name),
                code(f"{prefix}{name}".upper()),
                code(type_name(field.annotation)),
                default(field),
                bounds(field),
                meaning(Settings, name, field),
            )
        )
    intro = (
        f"{first_paragraph(Settings.__doc__)} A flag of `shipyard serve` wins over its "
        "variable; a setting without a flag is set by its variable alone. A value out of "
        "its bounds stops the gateway at start, naming the setting."
    )
    head = ("Setting", "Variable", "Type", "Default", "Bounds", "Meaning")
    return page("Settings", intro, table(head, rows))
