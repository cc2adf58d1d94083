"""FLUX.2's reference images (trainer/families/flux2/references.py) on the tiny klein and dev
twins, held to diffusers' ``Flux2KleinPipeline`` / ``Flux2Pipeline``: the packed reference
tokens and their position ids are the pipeline's own ``prepare_image_latents``'; the family's
denoiser call with 1 and 2 references is the transformer call the pipeline makes in its loop
(caught with a hook, the pipeline given the same images); the loss ignores what the
transformer answers at the reference tokens; a reference is sized as the pipeline sizes it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from trainer.config import ModelSection, TrainConfig
from trainer.families import family, spec
from trainer.models.loader import load_base_model
from trainer.models.text_conditioning import TextConditioning
from trainer.run.step import batch_loss, encode_images

pytestmark = pytest.mark.usefixtures("no_network")
TWINS = {"klein": "embedded:tiny-flux2", "dev": "embedded:tiny-flux2-dev"}
CAPTION = "make the circle red"


@pytest.fixture(scope="module", params=sorted(TWINS))
def model(request):
    return load_base_model(ModelSection(pretrained_model_name_or_path=TWINS[request.param]))


def pipeline(model):
    return family("flux2").pipeline(model, model.denoiser, model.noise_scheduler)


def references(sizes, seed=0) -> list[Image.Image]:
    """Random RGB images of ``sizes`` (w, h), multiples of 16 (the pipeline keeps them), at
    least 64 on a side (the pipeline refuses less)."""
    gen = torch.Generator().manual_seed(seed)
    return [Image.fromarray((torch.rand(h, w, 3, generator=gen) * 255).byte().numpy())
            for w, h in sizes]


def pixels(pipe, image: Image.Image) -> torch.Tensor:
    """The image as the pipeline preprocesses it, [1, 3, H, W] in [-1, 1]."""
    return pipe.image_processor.preprocess(image, height=image.height, width=image.width,
                                           resize_mode="crop")


def test_flux2_takes_optional_references_up_to_bfls_count():
    controls = spec("flux2").controls
    assert (controls.max, controls.required, controls.text) == (10, 0, False)
    assert (controls.area, controls.multiple, controls.shrink_only) == (1024 * 1024, 16, True)


def test_the_packed_references_and_their_ids_are_the_pipelines(model):
    """Our latents of each reference (encode_images, as the step and the latent cache encode
    controls), packed: the pipeline's ``prepare_image_latents`` tokens and ids, bit for bit;
    the i-th reference's time coordinate is 10 * (i + 1)."""
    from diffusers import Flux2KleinPipeline as Pipe

    from trainer.families.flux2.references import pack_references

    pipe = pipeline(model)
    images = [pixels(pipe, im) for im in references([(64, 48), (32, 80)])]
    with torch.no_grad():
        want_tokens, want_ids = pipe.prepare_image_latents(images, batch_size=2, generator=None,
                                                           device="cpu", dtype=torch.float32)
        ours = [Pipe._patchify_latents(encode_images(model.vae, px, family("flux2")))
                .expand(2, -1, -1, -1) for px in images]  # two rows, one reference each
    tokens, ids = pack_references(ours)
    assert tokens.shape == (2, 3 * 4 + 2 * 5, 4 * model.vae.config.latent_channels)
    torch.testing.assert_close(tokens, want_tokens, rtol=0, atol=0)
    assert torch.equal(ids, want_ids)
    assert ids[0, :12, 0].unique().tolist() == [10] and ids[0, 12:, 0].unique().tolist() == [20]
    assert ids[0, 12:, 1].max() == 4 and ids[0, 12:, 2].max() == 1  # (h, w) of its own grid


def caught_call(model, images, guidance=None):
    """The pipeline's second denoising step at 64 x 64 with ``images`` as its references,
    caught at the transformer: (its keyword arguments, its output)."""
    calls = []

    def catch(module, args, kwargs, output):
        calls.append((kwargs, output[0]))

    handle = model.denoiser.register_forward_hook(catch, with_kwargs=True)
    extra = {} if guidance is None else {"guidance_scale": guidance}
    try:
        with torch.no_grad():
            pipeline(model)(prompt=[CAPTION], image=images, height=64, width=64,
                            num_inference_steps=2, output_type="latent",
                            generator=torch.Generator().manual_seed(0), **extra)
    finally:
        handle.remove()
    return calls[1]


@pytest.mark.parametrize("sizes", [[(96, 64)], [(96, 64), (64, 80)]], ids=["one", "two"])
def test_predict_with_references_is_the_pipelines_transformer_call(model, sizes):
    """The pipeline's call with 1 and 2 reference images: our predict on its noisy target
    (unpacked), its sigma, our text conditioning and our latents of the same images gives its
    output for the target's tokens (1e-5); without the references the output differs."""
    from diffusers import Flux2KleinPipeline as Pipe

    images = references(sizes, seed=len(sizes))
    dev = model.variant == "dev"
    kwargs, out = caught_call(model, images, guidance=2.5 if dev else None)
    target = 4 * 4  # 64 px / 16 per token, squared
    assert kwargs["hidden_states"].shape[1] == target + sum(w * h // 256 for w, h in sizes)
    flux2 = family("flux2", guidance=2.5 if dev else None)
    unpack = lambda x: x.permute(0, 2, 1).reshape(1, -1, 4, 4)  # noqa: E731
    noisy = Pipe._unpatchify_latents(unpack(kwargs["hidden_states"][:, :target]))
    text = flux2.encode(model, [CAPTION], clip_skip=1)
    pipe = pipeline(model)
    with torch.no_grad():
        controls = [encode_images(model.vae, pixels(pipe, im), flux2) for im in images]
        ours = flux2.predict(model, noisy, kwargs["timestep"], text, None, controls=controls)
        alone = flux2.predict(model, noisy, kwargs["timestep"], text, None)
    assert ours.shape == noisy.shape
    # the hook sees an output for every token; the pipeline keeps the target's
    assert out.shape[1] == kwargs["hidden_states"].shape[1]
    want = unpack(out[:, :target])
    torch.testing.assert_close(Pipe._patchify_latents(ours), want, rtol=1e-5, atol=1e-5)
    assert (Pipe._patchify_latents(alone) - want).abs().max() > 1e-4


def test_the_loss_is_taken_on_the_targets_tokens_only(model, monkeypatch):
    """Whatever the transformer answers at the references' tokens leaves the loss unchanged;
    what it answers at the target's changes it."""
    cfg = TrainConfig(model={"pretrained_model_name_or_path": TWINS[
        "dev" if model.variant == "dev" else "klein"]})
    gen = torch.Generator().manual_seed(3)
    channels = model.vae.config.latent_channels
    hidden = torch.randn(1, 12, model.denoiser.config.joint_attention_dim, generator=gen)
    controls = [torch.randn(1, channels, 6, 4, generator=gen),
                torch.randn(1, channels, 4, 8, generator=gen)]
    batch = SimpleNamespace(latents=torch.randn(1, channels, 8, 8, generator=gen),
                            text=TextConditioning(hidden), controls=controls, size_ids=None,
                            loss_weights=torch.ones(1), mask=None, rows=None)
    forward = model.denoiser.forward
    target, total = 4 * 4, 4 * 4 + 3 * 2 + 2 * 4

    def loss_with(offset: torch.Tensor) -> float:
        def shifted(*args, **kwargs):
            out = forward(*args, **kwargs)
            assert out[0].shape[1] == total
            return (out[0] + offset,)

        monkeypatch.setattr(model.denoiser, "forward", shifted)
        torch.manual_seed(5)
        with torch.no_grad():
            return float(batch_loss(batch, model, cfg, torch.device("cpu"), torch.float32))

    zero = torch.zeros(1, total, 4 * channels)
    on_references, on_target = zero.clone(), zero.clone()
    on_references[:, target:] = 100.0
    on_target[:, :target] = 100.0
    base = loss_with(zero)
    assert loss_with(on_references) == base
    assert loss_with(on_target) > base + 1.0


@pytest.fixture(scope="module")
def pipeline_size():
    """The (w, h) the klein pipeline hands its VAE for a reference image of a size (caught
    before encoding)."""
    from diffusers import Flux2KleinPipeline

    from trainer.models.loader import resolve_model_path

    class Caught(Exception):
        pass

    pipe = Flux2KleinPipeline.from_pretrained(resolve_model_path(TWINS["klein"]),
                                              local_files_only=True)
    seen = []

    def prepare_image_latents(images, **kwargs):
        seen.extend(tuple(im.shape[-1:-3:-1]) for im in images)  # (w, h)
        raise Caught

    pipe.prepare_image_latents = prepare_image_latents
    embeds = torch.zeros(1, 4, pipe.transformer.config.joint_attention_dim)

    def size_of(size: tuple[int, int]) -> tuple[int, int]:
        seen.clear()
        with pytest.raises(Caught):
            pipe(prompt_embeds=embeds, image=Image.new("RGB", size), height=64, width=64,
                 num_inference_steps=1)
        [out] = seen
        return out

    return size_of


@pytest.mark.parametrize("size", [(64, 64), (100, 70), (97, 300), (1030, 1030), (2000, 1500),
                                  (1300, 900)])
def test_a_reference_is_sized_as_the_pipeline_sizes_it(size, pipeline_size):
    """The size a reference trains at is the pipeline's: its own, sides cut to multiples of
    16; above 1024 x 1024 pixels scaled down to about that area first."""
    from trainer.data.control_sizing import ControlSizing, own_size

    sizing = ControlSizing.of_family(spec("flux2").controls)
    assert own_size(size, sizing) == pipeline_size(size)


def test_a_folder_datasets_references_come_at_the_pipelines_sizes(tmp_path, pipeline_size):
    """The data layer renders each reference at that size, whatever its target's bucket; with
    dataset.control_resolution, at about that side squared instead."""
    from control_helpers import noise, pairs

    from trainer.data import prepare_dataset

    train = pairs(tmp_path, names=("a", "b"), sizes=((64, 64), (64, 128)))
    noise(train / "control" / "a.png", (1100, 1000), seed=4)
    noise(train / "control" / "b.png", (100, 70), seed=5)

    def control_sizes(**dataset) -> set:
        cfg = TrainConfig(model={"pretrained_model_name_or_path": TWINS["klein"]},
                          dataset={"train_data_dir": str(train), "resolution": 64,
                                   "bucket_reso_steps": 16, "min_bucket_reso": 64,
                                   "control_dir": "control", "cache_latents": False,
                                   **dataset})
        data = prepare_dataset(cfg, lambda _: None, data_home=tmp_path)
        return {tuple(b.control_pixels[0].shape[-1:-3:-1]) for b in data.epoch(0, 1, seed=1)}

    assert control_sizes() == {pipeline_size((1100, 1000)), pipeline_size((100, 70))}
    # about 64 x 64 pixels at each one's aspect (1.1 and 1.43), sides cut to multiples of 16
    assert control_sizes(control_resolution=64) == {(64, 48)}


def test_a_reference_the_pipeline_would_refuse_is_refused_before_the_run(tmp_path):
    """Sizes on both sides of the pipeline's limits (Flux2ImageProcessor.check_image_input:
    64 px a side, 8:1): the dataset check refuses, naming the file, exactly the references
    that the pipeline's own check refuses; the others prepare."""
    from control_helpers import noise, pairs
    from diffusers.pipelines.flux2.image_processor import Flux2ImageProcessor

    from trainer.data import prepare_dataset

    for i, size in enumerate([(63, 64), (64, 64), (64, 512), (64, 513), (520, 64), (64, 40)]):
        root = tmp_path / str(i)
        train = pairs(root, names=("a",), sizes=((64, 64),))
        noise(train / "control" / "a.png", size, seed=i)
        cfg = TrainConfig(model={"pretrained_model_name_or_path": TWINS["klein"]},
                          dataset={"train_data_dir": str(train), "resolution": 64,
                                   "bucket_reso_steps": 16, "min_bucket_reso": 64,
                                   "control_dir": "control", "cache_latents": False})
        try:
            Flux2ImageProcessor.check_image_input(Image.new("RGB", size))
            refused_by_pipeline = None
        except ValueError as exc:
            refused_by_pipeline = str(exc)
        if refused_by_pipeline is None:
            prepare_dataset(cfg, lambda _: None, data_home=root)
            continue
        with pytest.raises(ValueError) as caught:
            prepare_dataset(cfg, lambda _: None, data_home=root)
        message = str(caught.value)
        assert str(train / "control" / "a.png") in message, message
        assert f"{size[0]}x{size[1]}" in message and "FLUX.2" in message
