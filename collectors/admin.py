"""Django admin: where an admin sets what SparkOps may not learn by itself.

``Engine.managed`` lets SparkOps stop and start a container without the ``sparkops.manage``
label; the prefill setting overrides the estimate's activation bytes per token. The table of
model architectures (``ModelArchitecture``) is what the KV planner reads for a model whose
config.json it cannot read from the engine: an admin adds or corrects a model by pasting its
config.json, which is read as the planner reads it before the row is saved
(``ModelArchitecture.clean``), and every save records who changed the row.
"""

from __future__ import annotations

import json

from django import forms
from django.contrib import admin
from django.forms.fields import InvalidJSONInput
from django.utils import timezone

from collectors.models import Engine, ModelArchitecture, Node


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "hostname", "mem_total_bytes", "last_collection_at")
    readonly_fields = ("mem_total_bytes", "last_collection_at", "rolled_up_until", "gpu",
                       "gpu_read_at", "ledger", "ledger_baseline", "engine_discovery_error")


@admin.register(Engine)
class EngineAdmin(admin.ModelAdmin):
    list_display = ("name", "node", "phase", "container_state", "managed",
                    "prefill_bytes_per_token")
    list_editable = ("managed", "prefill_bytes_per_token")
    list_filter = ("node", "phase", "managed")
    fields = ("node", "name", "managed", "prefill_bytes_per_token")
    readonly_fields = ("node", "name")


class PastedJSONField(forms.JSONField):
    """A JSON file pasted into a text area: shown indented, empty when there is none, and
    refused in words when it is not JSON."""

    def __init__(self, *, file_name: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.error_messages["invalid"] = f"{file_name} is not valid JSON."

    def prepare_value(self, value):
        if isinstance(value, InvalidJSONInput):
            return value
        return "" if value is None else json.dumps(value, indent=2, ensure_ascii=False)


class ModelArchitectureForm(forms.ModelForm):
    config = PastedJSONField(file_name="config.json", required=False,
                             label=ModelArchitecture._meta.get_field("config").verbose_name,
                             help_text=ModelArchitecture._meta.get_field("config").help_text,
                             widget=forms.Textarea(attrs={"rows": 24, "cols": 90}))
    hf_quant_config = PastedJSONField(
        file_name="hf_quant_config.json", required=False,
        label=ModelArchitecture._meta.get_field("hf_quant_config").verbose_name,
        help_text=ModelArchitecture._meta.get_field("hf_quant_config").help_text,
        widget=forms.Textarea(attrs={"rows": 6, "cols": 90}))

    class Meta:
        model = ModelArchitecture
        fields = ("repo_id", "aliases", "config", "hf_quant_config", "unknown_reason", "source")
        widgets = {"aliases": forms.Textarea(attrs={"rows": 3, "cols": 60}),
                   "unknown_reason": forms.Textarea(attrs={"rows": 3, "cols": 90}),
                   "source": forms.Textarea(attrs={"rows": 2, "cols": 90})}


@admin.register(ModelArchitecture)
class ModelArchitectureAdmin(admin.ModelAdmin):
    form = ModelArchitectureForm
    list_display = ("repo_id", "entry_kind", "source", "origin", "changed_by", "changed_at")
    list_filter = ("untouched_seed",)
    search_fields = ("repo_id", "aliases")
    readonly_fields = ("changed_by", "changed_at", "untouched_seed")
    fields = ("repo_id", "aliases", "config", "hf_quant_config", "unknown_reason", "source",
              "changed_by", "changed_at", "untouched_seed")

    @admin.display(description="kind of entry")
    def entry_kind(self, row: ModelArchitecture) -> str:
        return "config.json" if row.config is not None else "cannot be planned"

    @admin.display(description="origin", ordering="untouched_seed")
    def origin(self, row: ModelArchitecture) -> str:
        return "seed, untouched" if row.untouched_seed else "set by an admin"

    def save_model(self, request, obj: ModelArchitecture, form, change: bool) -> None:
        obj.changed_by = request.user
        obj.changed_at = timezone.now()
        obj.untouched_seed = False
        super().save_model(request, obj, form, change)
