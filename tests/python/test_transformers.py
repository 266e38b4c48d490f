"""The fine-tunes people run: Hugging Face Transformers models (a left-padded
Llama causal LM, a BERT classifier with dropout, a ViT) built from small
configs, trained with the Trainer guarded in one line and with a hand-written
loop, in bf16 and fp16, with gradient accumulation, gradient checkpointing and
attention dropout. Each planted fault is named at its op, module,
micro-batch and row (or input), gets its remedy, and every skipped run ends
bit for bit where the plain run ends with that one update dropped by hand.
torch 2.14 with Debian testing's python3-transformers; skipped elsewhere."""
import copy
import logging

import pytest
import torch
import torch.nn.functional as F

import nanscope

transformers = pytest.importorskip("transformers")
if not hasattr(torch.amp, "GradScaler"):
    pytest.skip("torch.amp.GradScaler (torch 2.3+) needed", allow_module_level=True)

from transformers import (BertConfig, BertForSequenceClassification, BertForTokenClassification,  # noqa: E402
                          LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments, ViTConfig, ViTForImageClassification)

transformers.logging.set_verbosity_error()

FAULT_STEP = 3  # the optimizer step whose micro-batch holds the fault
FAULT_ROW = 2


# --- The models, each from a small config, and their data.

def llama(attention_dropout=0.0):
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         attention_dropout=attention_dropout, pad_token_id=0)
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config)


def bert(hidden_dropout=0.1):
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, hidden_dropout_prob=hidden_dropout,
                        attention_probs_dropout_prob=hidden_dropout, num_labels=3, max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    return BertForSequenceClassification(config)


def vit():
    config = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=64, num_labels=3, hidden_dropout_prob=0.0)
    return ViTForImageClassification(config)


class Samples(torch.utils.data.Dataset):
    """A fixed list of samples (dicts of tensors), the fault planted in one."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def text_samples(n, seq=12, causal=True, seed=0):
    """Left-padded token sequences: the first pad tokens' query rows see only
    masked keys (fully masked rows under SDPA)."""
    g = torch.Generator().manual_seed(seed)
    items = []
    for i in range(n):
        length = int(torch.randint(4, seq + 1, (), generator=g))
        ids = torch.zeros(seq, dtype=torch.long)
        ids[seq - length:] = torch.randint(1, 64, (length,), generator=g)
        mask = (ids != 0).long()
        item = {"input_ids": ids, "attention_mask": mask}
        if causal:
            item["labels"] = torch.where(mask.bool(), ids, torch.full_like(ids, -100))
        else:
            item["labels"] = torch.randint(0, 3, (), generator=g)
        items.append(item)
    return items


def image_samples(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"pixel_values": torch.randn(3, 16, 16, generator=g), "labels": torch.randint(0, 3, (), generator=g)}
            for _ in range(n)]


def plant(items, batch_size, accumulation, fault):
    """The fault in the sample that is row FAULT_ROW of the last micro-batch
    of optimizer step FAULT_STEP."""
    index = (FAULT_STEP * accumulation + accumulation - 1) * batch_size + FAULT_ROW
    item = dict(items[index])
    if fault == "nan_pixel":
        item["pixel_values"] = item["pixel_values"].clone()
        item["pixel_values"][1, 4, 7] = float("nan")
    elif fault == "no_targets":  # a prompt-only sample: no token to learn from
        item["labels"] = torch.full_like(item["labels"], -100)
    items[index] = item
    return items


class PerSampleMeanTrainer(Trainer):
    """A subclass of the kind fine-tunes write: each sample's mean token loss,
    then the batch's mean. A sample without targets is 0 / 0."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs["labels"]
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        logits = outputs.logits[:, :-1].float()
        targets = labels[:, 1:]
        token_loss = F.cross_entropy(logits.transpose(1, 2), targets.clamp_min(0), reduction="none")
        counted = (targets != -100).float()
        loss = ((token_loss * counted).sum(1) / counted.sum(1)).mean()
        return (loss, outputs) if return_outputs else loss


# --- The Trainer, guarded and plain.

class DropUpdate(TrainerCallback):
    """The plain run with one optimizer step's update dropped by hand, as the
    guard drops it: no optimizer step (Adam's state and step count stay), the
    scheduler does not advance (the Trainer steps it unless the step was
    skipped), the global step counts on."""

    def __init__(self, step):
        self.step = step
        self.trainer = None
        self._kept = None

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            prepared = self.trainer.optimizer
            inner = prepared.optimizer
            self._kept = inner.step
            inner.step = lambda *a, **k: None
            prepared._is_overflow = True

    def on_step_end(self, args, state, control, **kwargs):
        if self._kept is not None:
            self.trainer.optimizer.optimizer.step = self._kept
            self.trainer.optimizer._is_overflow = False
            self._kept = None


class StopAfter(TrainerCallback):
    """The process stops (is killed) after this step's update."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def train(tmp_path, make_model, items, *, guarded, drop=None, trainer_class=Trainer, accumulation=1,
          batch_size=4, bf16=True, fp16=False, checkpointing=False, steps=None, resume=None, save_steps=None,
          stop_after=None, sampling="sequential", **guard_options):
    torch.manual_seed(0)
    model = make_model()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=accumulation, max_steps=steps or len(items) // (batch_size * accumulation),
        learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=2, logging_steps=1, bf16=bf16, fp16=fp16,
        use_cpu=True, report_to=[], save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500,
        seed=0, data_seed=0, dataloader_num_workers=0, max_grad_norm=1.0, disable_tqdm=True,
        train_sampling_strategy=sampling,
        logging_nan_inf_filter=False)
    trainer = trainer_class(model=model, args=args, train_dataset=Samples(items))
    guard = None
    if guarded:
        guard = nanscope.guard_trainer(trainer, run_dir=str(tmp_path / "run"), **guard_options)
    if stop_after is not None:
        trainer.add_callback(StopAfter(stop_after))
    if drop is not None:
        callback = DropUpdate(drop)
        callback.trainer = trainer
        trainer.add_callback(callback)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, guard


def same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), f"{name} differs"


CASES = {
    # name: (model, samples, fault, trainer class, expected birth, expected remedy)
    "vit-nan-pixel": (vit, image_samples, "nan_pixel", Trainer,
                      "nan at input 'pixel_values' (input) in module ''{mb}, batch row 2", "data"),
    "llama-prompt-only-sample": (lambda: llama(attention_dropout=0.1), lambda n: text_samples(n), "no_targets",
                                 PerSampleMeanTrainer, "nan at aten::div (forward) in module ''{mb}, batch row 2",
                                 "model_or_data"),  # a correct sample, an unsafe mean: fix the op
    "bert-prompt-only-sample": (bert, lambda n: text_samples(n, causal=True), "no_targets", PerSampleMeanTrainer,
                                None, "data"),
}


@pytest.mark.parametrize("accumulation", [1, 4])
@pytest.mark.parametrize("case", ["vit-nan-pixel", "llama-prompt-only-sample"])
def test_the_trainer_guarded_in_one_line_names_the_fault_and_skips_as_the_plain_run_drops_it(
        tmp_path, case, accumulation, nanscope_lines):
    make_model, samples, fault, trainer_class, birth, remedy = CASES[case]
    items = plant(samples(4 * accumulation * 6), 4, accumulation, fault)
    trainer, guard = train(tmp_path / "guarded", make_model, items, guarded=True, trainer_class=trainer_class,
                           accumulation=accumulation, config=nanscope.GuardConfig(fallback="auto"))
    step = guard.guard
    assert step.skipped_steps == 1, nanscope_lines()
    micro = f", micro-batch {accumulation - 1}" if accumulation > 1 else ""
    assert step.last_first_birth == birth.format(mb=micro), step.last_first_birth
    assert step.amp == "bf16" and step.lr_multiplier == 1.0, "a data fault costs no precision and no LR"
    assert step.fallbacks == 0
    # The remedy is the row search's: a model with dropout on is searched by
    # putting a copy of another row in each suspect's place, every draw kept.
    import h5py
    with h5py.File(tmp_path / "guarded" / "run" / "run.h5", "r") as f:
        remedies = [t.decode() for k, t in zip(f["/events/kind"][:], f["/events/text"][:])
                    if k.decode().rstrip("\0") == "remedy"]
    assert len(remedies) == 1 and remedies[0].startswith(remedy + ":"), remedies
    if case == "llama-prompt-only-sample":  # attention dropout 0.1
        assert (f"finite without batch row {FAULT_ROW} (each row tested by putting a copy of another row in its "
                "place: every shape and every random draw stayed as it was)") in remedies[0], remedies[0]
    # The Trainer's logs carry the guard's counts, on the step after the skip
    # its first birth; the scheduler stood still on the skipped step.
    logged = [entry for entry in trainer.state.log_history if "nanscope/skipped_steps" in entry]
    assert logged and logged[-1]["nanscope/skipped_steps"] == 1
    births = [entry for entry in logged if "nanscope/first_birth" in entry]
    assert len(births) == 1 and births[0]["step"] == FAULT_STEP + 1, births
    plain, _ = train(tmp_path / "plain", make_model, items, guarded=False, trainer_class=trainer_class,
                     accumulation=accumulation, drop=FAULT_STEP)
    same_weights(trainer.model, plain.model)
    assert trainer.state.global_step == plain.state.global_step
    assert trainer.lr_scheduler.last_epoch == plain.lr_scheduler.last_epoch
    inner = trainer.optimizer.optimizer
    plain_inner = plain.optimizer.optimizer
    for p, q in zip(inner.param_groups[0]["params"], plain_inner.param_groups[0]["params"]):
        assert int(inner.state[p]["step"]) == int(plain_inner.state[q]["step"])


def bert_tagger():
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, num_labels=3,
                        max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    return BertForTokenClassification(config)


def tagged_samples(n, seq=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(1, 64, (seq,), generator=g), "attention_mask": torch.ones(seq, dtype=torch.long),
             "labels": torch.randint(0, 3, (seq,), generator=g)} for _ in range(n)]


def test_a_micro_batch_whose_every_label_is_ignored_adds_nothing_as_in_the_plain_trainer(tmp_path, nanscope_lines):
    """Token classification with accumulation 4, dropout on: micro-batch 1
    of step FAULT_STEP has every label -100. BERT's loss, a mean over no
    token, is NaN and its gradients exactly zero: the plain Trainer's update
    is the other three micro-batches', and the guard's is too, to the bit."""
    accumulation, batch_size = 4, 4
    items = tagged_samples(batch_size * accumulation * 6)
    first = (FAULT_STEP * accumulation + 1) * batch_size
    for i in range(first, first + batch_size):
        items[i] = dict(items[i], labels=torch.full_like(items[i]["labels"], -100))
    trainer, guard = train(tmp_path / "guarded", bert_tagger, items, guarded=True, accumulation=accumulation,
                           config=nanscope.GuardConfig(fallback="auto"))
    step = guard.guard
    assert step.skipped_steps == 0 and step.fallbacks == 0 and step.amp == "bf16", nanscope_lines()
    plain, _ = train(tmp_path / "plain", bert_tagger, items, guarded=False, accumulation=accumulation)
    same_weights(trainer.model, plain.model)
    assert trainer.state.global_step == plain.state.global_step
    lines = nanscope_lines()
    assert (f"step {FAULT_STEP}: micro-batch 1 of 4 left out: loss nan, a mean over no target "
            "(aten::cross_entropy_loss counted none)") in lines, lines


# --- A hand-written loop (the watched form), bf16 and fp16.

def weighted_loss(model, batch):
    """A classifier's loss with a weight per sample from the data set."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    per_sample = F.cross_entropy(logits, batch["labels"], reduction="none")
    return (per_sample * batch["weight"]).sum() / batch["weight"].sum()


def lm_loss(model, batch):
    """A causal LM's per-sample mean token loss (a prompt-only sample is 0 / 0)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
    targets = batch["labels"][:, 1:]
    token_loss = F.cross_entropy(logits.transpose(1, 2), targets.clamp_min(0), reduction="none")
    counted = (targets != -100).float()
    return ((token_loss * counted).sum(1) / counted.sum(1)).mean()


def image_loss(model, batch):
    return model(**batch).loss


def hand_loop(tmp_path, make_model, items, loss_of, *, amp, accumulation, guarded, checkpointing=False, batch_size=4,
              drop=None):
    """The loop as its author wrote it; guarded, the guard takes GradScaler's
    place. drop: the step whose update the plain loop drops by hand."""
    torch.manual_seed(0)
    model = make_model()
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(Samples(items), batch_size=batch_size, shuffle=False)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[amp]
    if guarded:
        scaler = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp=amp, loss_fn=loss_of,
                                    config=nanscope.GuardConfig(fallback="auto"))
        autocast = scaler.autocast
    else:
        scaler = torch.amp.GradScaler("cpu", enabled=amp == "fp16")

        def autocast():
            return torch.autocast("cpu", dtype=dtype)
    batches = list(loader)
    for step in range(len(batches) // accumulation):
        for micro in batches[step * accumulation:(step + 1) * accumulation]:
            with autocast():
                loss = loss_of(model, micro) / accumulation
            if guarded:
                scaler.backward(loss, micro)
            else:
                scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if step != drop:
            scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    return model, optimizer, scaler


def weighted_text_samples(n):
    items = text_samples(n, causal=False)
    for i, item in enumerate(items):
        item["weight"] = torch.tensor(1.0 + (i % 3) / 2)
    return items


HAND_CASES = {
    # name: (model, samples, fault, loss, amp, accumulation, checkpointing, expected birth)
    "bert-fp16-checkpointed-accumulated": (bert, weighted_text_samples, "nan_weight", weighted_loss, "fp16", 4, True,
                                           "nan at input 'weight' (input) in module ''{mb}, batch row 2"),
    "vit-fp16": (vit, image_samples, "nan_pixel", image_loss, "fp16", 1, False,
                 "nan at input 'pixel_values' (input) in module ''{mb}, batch row 2"),
    "llama-bf16-attention-dropout-accumulated": (lambda: llama(attention_dropout=0.1), lambda n: text_samples(n),
                                                 "no_targets", lm_loss, "bf16", 4, False,
                                                 "nan at aten::div (forward) in module ''{mb}, batch row 2"),
}


@pytest.mark.parametrize("case", sorted(HAND_CASES))
def test_a_hand_written_loop_guarded_in_the_scalers_place_ends_as_the_plain_loop(tmp_path, case, caplog):
    make_model, samples, fault, loss_of, amp, accumulation, checkpointing, birth = HAND_CASES[case]
    caplog.set_level(logging.INFO, logger="nanscope")
    items = samples(4 * accumulation * 6)
    if fault == "nan_weight":
        index = (FAULT_STEP * accumulation + accumulation - 1) * 4 + FAULT_ROW
        items[index] = dict(items[index], weight=torch.tensor(float("nan")))
    else:
        items = plant(items, 4, accumulation, fault)
    model, optimizer, guard = hand_loop(tmp_path / "guarded", make_model, items, loss_of, amp=amp,
                                        accumulation=accumulation, guarded=True, checkpointing=checkpointing)
    micro = f", micro-batch {accumulation - 1}" if accumulation > 1 else ""
    assert guard.last_first_birth == birth.format(mb=micro), guard.last_first_birth
    assert guard.amp == amp and guard.lr_multiplier == 1.0 and guard.fallbacks == 0
    # fp16: the scaler's own backoffs (gradients that overflow at a scale it can
    # still lower) are its routine: one line each at INFO, no forensics, no
    # snapshot; only the fault got one.
    assert len(guard.snapshots) == 1, guard.snapshots
    routine = [r for r in caplog.records if r.name == "nanscope" and "the scaler's routine" in r.getMessage()]
    assert all(r.levelno == logging.INFO for r in routine)
    assert not [r for r in caplog.records if r.name == "nanscope" and "first birth" in r.getMessage()
                and "step 3:" not in r.getMessage()], "only the fault's step is investigated"
    # The plain loop: in fp16 its GradScaler skips the same steps by itself
    # (the scaler's overflows and the fault's NaN); in bf16 the fault's update
    # is dropped by hand.
    plain, plain_optimizer, plain_scaler = hand_loop(tmp_path / "plain", make_model, items, loss_of, amp=amp,
                                                     accumulation=accumulation, guarded=False,
                                                     checkpointing=checkpointing,
                                                     drop=FAULT_STEP if amp == "bf16" else None)
    same_weights(model, plain)
    assert guard.get_scale() == (plain_scaler.get_scale() if amp == "fp16" else 1.0)
    for p, q in zip(optimizer.param_groups[0]["params"], plain_optimizer.param_groups[0]["params"]):
        assert int(optimizer.state[p]["step"]) == int(plain_optimizer.state[q]["step"])


# --- The Trainer's precision, clipping, logs and checkpoints.

def run_rows(path):
    import h5py
    with h5py.File(path, "r", libver="latest", swmr=True) as f:
        n = f["steps/step"].shape[0]
        return {name: f["steps"][name][:n].tolist() for name in ("step", "grad_norm", "amp", "skipped", "loss_scale")}


def test_fp16_where_the_accelerator_runs_none_the_guard_trains_in_fp32_as_the_plain_trainer(tmp_path):
    """Trainer(fp16=True, use_cpu=True): Accelerate has no fp16 on CPU (no
    autocast, no scaler), so the run is fp32; a guard that scaled the loss by
    65536 there would shrink every clipped update 65536 times."""
    items = image_samples(4 * 6)
    trainer, guard = train(tmp_path / "guarded", vit, items, guarded=True, bf16=False, fp16=True)
    assert guard.guard.amp == "fp32" and not guard.guard.is_enabled()
    plain, _ = train(tmp_path / "plain", vit, items, guarded=False, bf16=False, fp16=True)
    same_weights(trainer.model, plain.model)
    guarded_norms = [e["grad_norm"] for e in trainer.state.log_history if "grad_norm" in e]
    plain_norms = [e["grad_norm"] for e in plain.state.log_history if "grad_norm" in e]
    assert guarded_norms == plain_norms, "the Trainer's clip and its logged norm see unscaled gradients"
    rows = run_rows(tmp_path / "guarded" / "run" / "run.h5")
    assert set(rows["amp"]) == {0}, "run.h5 records the precision that ran: fp32"


@pytest.mark.parametrize("bf16", [True, False])
def test_run_h5s_grad_norm_is_the_one_before_the_trainers_clip(tmp_path, bf16):
    items = image_samples(4 * 6)
    trainer, guard = train(tmp_path, vit, items, guarded=True, bf16=bf16)
    logged = [e["grad_norm"] for e in trainer.state.log_history if "grad_norm" in e]
    rows = run_rows(tmp_path / "run" / "run.h5")
    assert max(logged) > 1.0, "the clip (max_grad_norm=1) must have acted for the test to mean something"
    assert rows["grad_norm"] == pytest.approx(logged, rel=1e-5), (rows["grad_norm"], logged)


def test_the_trainers_clip_takes_the_guards_norm_and_clips_as_the_plain_trainer_bit_for_bit(tmp_path, monkeypatch):
    """The guard has taken the step's norm when the Trainer clips; the clip
    takes that one instead of taking it again, and the run stays the plain
    run: the same weights and the same logged norms, to the bit."""
    items = image_samples(4 * 6)
    plain, _ = train(tmp_path / "plain", vit, items, guarded=False)
    clip = torch.nn.utils.clip_grad_norm_
    norms_taken = []
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda *a, **k: norms_taken.append(1) or clip(*a, **k))
    trainer, guard = train(tmp_path / "guarded", vit, items, guarded=True)
    assert guard.guard.skipped_steps == 0
    assert norms_taken == [], "the Trainer's clip took the norm again"
    plain_norms = [e["grad_norm"] for e in plain.state.log_history if "grad_norm" in e]
    guarded_norms = [e["grad_norm"] for e in trainer.state.log_history if "grad_norm" in e]
    assert max(plain_norms) > 1.0, "the clip (max_grad_norm=1) must have acted for the test to mean something"
    assert guarded_norms == plain_norms
    same_weights(trainer.model, plain.model)


def test_resumed_from_a_trainer_checkpoint_the_guard_goes_on_and_appends_to_its_run_file(tmp_path):
    """The Trainer saves the guard's state_dict as scaler.pt and loads it on
    resume_from_checkpoint before any callback runs. The resumed run ends
    where the plain Trainer, stopped and resumed alike, ends with the fault's
    update dropped by hand; run.h5 keeps the rows and the skip from before
    the checkpoint. (Transformers 5.12's own resume is not bit for bit its
    uninterrupted run here: the step after the checkpoint sees another batch,
    guarded or not; so the reference is resumed the same way.)"""
    items = plant(image_samples(4 * 8), 4, 1, "nan_pixel")

    def stopped_then_resumed(where, guarded):
        first, guard = train(where, vit, items, guarded=guarded, steps=8, save_steps=4, stop_after=5,
                             drop=None if guarded else FAULT_STEP)
        if guarded:
            assert guard.guard.skipped_steps == 1
            assert (where / "out" / "checkpoint-4" / "scaler.pt").exists()
        second, resumed = train(where, vit, items, guarded=guarded, steps=8, save_steps=4,
                                resume=str(where / "out" / "checkpoint-4"))
        return second, resumed
    second, resumed = stopped_then_resumed(tmp_path / "guarded", True)
    plain, _ = stopped_then_resumed(tmp_path / "plain", False)
    same_weights(second.model, plain.model)
    # The state and the counts go on from step 4: the skip before the checkpoint
    # is counted, as the uninterrupted run counts it (nanscope/skipped_steps).
    assert resumed.guard.skipped_steps == 1 and resumed.guard.applied_steps == 7, "the state went on from step 4"
    rows = run_rows(tmp_path / "guarded" / "run" / "run.h5")
    assert rows["step"] == list(range(8)), rows["step"]  # step 4's first row went with the resume
    assert rows["skipped"][FAULT_STEP] == 1, "the skip before the checkpoint is kept"
    assert not (tmp_path / "guarded" / "run" / "run.1.h5").exists()


def test_a_sample_met_as_data_is_left_out_of_the_resumed_trainer_run(tmp_path):
    """The Trainer's own data set names each sample's row: the skip of the
    NaN pixel's step lists that row in the run's poison list. The run is
    stopped after the first step of its second epoch and resumed from the
    checkpoint at the first epoch's end; in the same order, every epoch would
    meet the sample again at the same step, and the resumed run never does:
    its row is replaced by the one before it, one skip in all, the list holds
    the row once. The rows never reach the model (its forward takes no such
    argument)."""
    items = plant(image_samples(16), 4, 1, "nan_pixel")
    row = FAULT_STEP * 4 + FAULT_ROW
    where = tmp_path / "guarded"
    _, first = train(where, vit, items, guarded=True, steps=12, save_steps=4, stop_after=5,
                     config=nanscope.GuardConfig(fallback="auto"))
    assert first.guard.skipped_steps == 1
    assert [s["row"] for s in nanscope.poisoned_samples(where / "run")] == [row]
    second, resumed = train(where, vit, items, guarded=True, steps=12, save_steps=4,
                            resume=str(where / "out" / "checkpoint-4"), config=nanscope.GuardConfig(fallback="auto"))
    assert second.state.global_step == 12
    assert resumed.guard.skipped_steps == 1, "the skip before the checkpoint, and none in the two epochs after it"
    assert [s["row"] for s in nanscope.poisoned_samples(where / "run")] == [row]
    rows = run_rows(where / "run" / "run.h5")
    assert [step for step, skipped in zip(rows["step"], rows["skipped"]) if skipped] == [FAULT_STEP], rows


def train_seq2seq(where, make_model, items, *, guarded, batch_size, drop=None, faults=()):
    """Seq2SeqTrainer over ITEMS in order, bf16, guarded in one line or plain
    (the update of step DROP dropped by hand); `faults(model)` gives callbacks."""
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments
    torch.manual_seed(0)
    args = Seq2SeqTrainingArguments(output_dir=str(where / "out"), per_device_train_batch_size=batch_size,
                                    max_steps=len(items) // batch_size, learning_rate=1e-3, bf16=True, use_cpu=True,
                                    report_to=[], save_strategy="no", seed=0, disable_tqdm=True,
                                    train_sampling_strategy="sequential", logging_steps=1)
    model = make_model()
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=Samples(items))
    guard = nanscope.guard_trainer(trainer, run_dir=str(where / "run")) if guarded else None
    for callback in faults(model) if faults else ():
        trainer.add_callback(callback)
    if drop is not None:
        callback = DropUpdate(drop)
        callback.trainer = trainer
        trainer.add_callback(callback)
    trainer.train()
    return trainer, guard


def test_a_seq2seq_trainer_is_guarded_in_the_same_line(tmp_path):
    from transformers import BartConfig, BartForConditionalGeneration

    def bart():
        return BartForConditionalGeneration(BartConfig(vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2,
                                                       encoder_attention_heads=2, decoder_attention_heads=2,
                                                       encoder_ffn_dim=64, decoder_ffn_dim=64,
                                                       max_position_embeddings=32, pad_token_id=1,
                                                       decoder_start_token_id=2))
    g = torch.Generator().manual_seed(0)
    items = [{"input_ids": torch.randint(1, 64, (8,), generator=g), "attention_mask": torch.ones(8, dtype=torch.long),
              "labels": torch.randint(1, 64, (6,), generator=g)} for _ in range(8)]
    items[FAULT_STEP] = dict(items[FAULT_STEP], labels=torch.full((6,), -100))  # a sample with nothing to learn

    def run(where, guarded, drop=None):
        return train_seq2seq(where, bart, items, guarded=guarded, batch_size=1, drop=drop)
    trainer, guard = run(tmp_path / "guarded", True)
    assert guard.guard.skipped_steps == 1 and guard.guard.amp == "bf16" and guard.guard.fallbacks == 0
    # BART's loss is a CrossEntropyLoss made inside its forward: no module of
    # the model's, nor another model; named by where it runs, BART's own forward.
    assert guard.guard.last_first_birth == ("nan at aten::cross_entropy_loss (forward) in module ''"), \
        guard.guard.last_first_birth
    plain, _ = run(tmp_path / "plain", False, drop=FAULT_STEP)
    same_weights(trainer.model, plain.model)


class OverflowAt(TrainerCallback):
    """One step's overflow in T5's feed-forward output, the classic fp16 fault,
    made certain at any precision (every output a sum of positive
    activations times 1e38), and undone after that step, as the data that
    drove it would be gone."""

    def __init__(self, step, module):
        self.step, self.module, self.kept = step, module, None

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.kept = self.module.weight.detach().clone()
            with torch.no_grad():
                self.module.weight.fill_(1e38)

    def on_step_end(self, args, state, control, **kwargs):
        if self.kept is not None:
            with torch.no_grad():
                self.module.weight.copy_(self.kept)
            self.kept = None


def test_t5_under_the_seq2seq_trainer_is_named_at_its_overflow_not_at_its_discarded_log(tmp_path):
    """T5's relative position buckets take log(0) = -inf and drop it with
    where(): under Seq2SeqTrainer, dropout on, the overflow at the
    feed-forward's wo is the birth, the log a note; the skip ends where the
    plain run ends with that update dropped."""
    from transformers import T5Config, T5ForConditionalGeneration

    def t5():
        return T5ForConditionalGeneration(T5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=2,
                                                   num_decoder_layers=2, num_heads=2,
                                                   relative_attention_num_buckets=8, dropout_rate=0.1,
                                                   decoder_start_token_id=0, pad_token_id=0))
    g = torch.Generator().manual_seed(0)
    items = [{"input_ids": torch.randint(1, 32, (6,), generator=g), "attention_mask": torch.ones(6, dtype=torch.long),
              "labels": torch.randint(1, 32, (5,), generator=g)} for _ in range(4 * 6)]

    def run(where, guarded, drop=None):
        return train_seq2seq(where, t5, items, guarded=guarded, batch_size=4, drop=drop, faults=lambda model: [
            OverflowAt(FAULT_STEP, model.encoder.block[1].layer[1].DenseReluDense.wo)])
    trainer, guard = run(tmp_path / "guarded", True)
    step = guard.guard
    assert step.skipped_steps == 1, step.last_first_birth
    born, _, note = step.last_first_birth.partition("; before it, ")
    assert born.startswith("inf at ") and "in module 'encoder.block.1.layer.1.DenseReluDense.wo'" in born, born
    assert note.startswith("inf at aten::log (forward) in module 'encoder.block.0.layer.0.SelfAttention'"), note
    plain, _ = run(tmp_path / "plain", False, drop=FAULT_STEP)
    same_weights(trainer.model, plain.model)


def test_the_replay_of_a_trainers_snapshot_names_what_it_measured(tmp_path):
    items = plant(image_samples(4 * 6), 4, 1, "nan_pixel")
    trainer, guard = train(tmp_path, vit, items, guarded=True)
    report = nanscope.replay(guard.guard.snapshots[0], model=vit, loss=lambda model, batch: model(**batch).loss,
                             write=False)
    text = str(report)
    assert report.verdict == "data", text
    assert "'pixel_values'" in text and "re-run raised" not in text, text
