"""[saving] settings of the Hugging Face Hub upload, named as sd-scripts names them
(``--huggingface_repo_id`` and the rest; trainer/run/hub.py does the upload). Off unless
``huggingface_repo_id`` is set. The token is not a setting: huggingface_hub reads it from
``HF_TOKEN`` or its token file (``hf auth login``), so that no config, saved copy or file
metadata ever holds it."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import model_validator

from trainer.config.sections.base import Section, setting


class HubUpload(Section):
    huggingface_repo_id: Optional[str] = setting(
        None, "Upload every saved file to this Hugging Face Hub repository ('owner/name'; "
        "created when missing). The token comes from HF_TOKEN or `hf auth login`, never from "
        "the config. Unset: no upload.", advanced=True,
        pattern=r"^[\w.-]+/[\w.-]+$", label="Hub repository",
    )
    huggingface_repo_type: Literal["model", "dataset"] = setting(
        "model", "Type of the Hub repository.", advanced=True, label="Hub repository type",
    )
    huggingface_path_in_repo: Optional[str] = setting(
        None, "Folder in the Hub repository that receives the files (unset: its root).",
        advanced=True, label="Folder in the Hub repository",
    )
    huggingface_repo_visibility: Literal["private", "public"] = setting(
        "private", "Visibility of the Hub repository when the upload creates it.",
        advanced=True, label="Hub repository visibility",
    )
    save_state_to_huggingface: bool = setting(
        False, "Also upload each training state (needs save_state and huggingface_repo_id).",
        advanced=True, label="Upload the training states",
    )
    resume_from_huggingface: bool = setting(
        False, "training.resume names a state on the Hub: 'owner/name/<folder in the "
        "repository>[:revision[:repo type]]', as sd-scripts reads it; it is downloaded "
        "first.", advanced=True, label="Resume from a state on the Hub",
    )
    async_upload: bool = setting(
        False, "Upload intermediate saves on a background thread, so that training goes on "
        "meanwhile (the final upload waits for them).", advanced=True,
        label="Upload in the background",
    )

    @model_validator(mode="after")
    def _hub_needs_repo(self):
        """The upload options do nothing without a repository (or, for the states, without
        states to upload)."""
        for key in ("save_state_to_huggingface", "async_upload"):
            if getattr(self, key) and not self.huggingface_repo_id:
                raise ValueError(f"saving.{key} uploads to saving.huggingface_repo_id; set it, "
                                 f"or turn {key} off")
        if self.save_state_to_huggingface and not getattr(self, "save_state", True):
            raise ValueError("saving.save_state_to_huggingface uploads the training states; set "
                             "saving.save_state too, or turn it off")
        return self
