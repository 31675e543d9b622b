"""Each script rule's module and triggers, for the engine to import a rule only when a file needs it,
and each model rule's module.

Generated from the rule modules (their ``triggers``, ``structural_triggers`` and ``helper_triggers``) by
``python -m tcaudit.rules.registry --write``; do not edit. tests/test_rule_registry.py fails when
this differs from what the modules declare. A trigger is a regex, or a tuple of the regexes that
``all_of`` joined; ``None`` means the rule decides in its own code (it is imported up front). Each
entry: (module, triggers, structural triggers by option, helper triggers).
"""

TRIGGER_TABLE = {
    "TC101": (
        "graph.tc101_gemm_dim_unaligned",
        (
            (r"\.\s*backward\b", r"Linear"),
        ),
        {},
        (),
    ),
    "TC102": (
        "graph.tc102_conv_channels_unaligned",
        (
            (r"\.\s*backward\b", r"Conv[123]d"),
        ),
        {},
        (),
    ),
    "TC104": (
        "graph.tc104_vocab_unaligned",
        (
            (r"\.\s*backward\b", r"vocab|tokens|Embedding"),
        ),
        {},
        (),
    ),
    "TC108": (
        "graph.tc108_fp8_candidate",
        (
            (r"\.\s*backward\b", '\\bcuda\\b|torch\\.accelerator\\b|[\\"\']gpu[\\"\']|device|gpu|rank|\\.to\\(\\s*\\d'),
        ),
        {},
        (),
    ),
    "TC201": (
        "amp.tc201_missing_autocast",
        (
            r"\.backward\(",
        ),
        {},
        (),
    ),
    "TC202": (
        "amp.tc202_deprecated_amp_api",
        (
            r"amp\b(?<!\wamp)",
        ),
        {},
        (),
    ),
    "TC203": (
        "amp.tc203_gradscaler_with_bf16",
        (
            r"Scaler",
        ),
        {},
        (),
    ),
    "TC204": (
        "amp.tc204_fp16_without_gradscaler",
        (
            r"\.backward\(",
        ),
        {},
        (),
    ),
    "TC205": (
        "amp.tc205_clip_before_unscale",
        (
            r"clip_grad",
        ),
        {},
        (),
    ),
    "TC206": (
        "amp.tc206_half_model_training",
        (
            (r"half|bfloat16|float16|HalfTensor", r"\.\s*backward\b"),
        ),
        {},
        (),
    ),
    "TC207": (
        "amp.tc207_backward_inside_autocast",
        (
            (r"autocast", r"\.\s*backward\b"),
        ),
        {},
        (),
    ),
    "TC208": (
        "amp.tc208_autocast_unsafe_op",
        (
            (r"binary_cross_entropy|BCELoss|sparse", r"(?i:autocast)|\.\s*backward\b"),
        ),
        {},
        (),
    ),
    "TC209": (
        "amp.tc209_apex_amp",
        (
            r"apex",
        ),
        {},
        (),
    ),
    "TC210": (
        "amp.tc210_scaler_not_checkpointed",
        (
            r"Scaler",
        ),
        {},
        (),
    ),
    "TC212": (
        "amp.tc212_double_optimizer_step",
        (
            r"\.step\(",
        ),
        {},
        (),
    ),
    "TC213": (
        "amp.tc213_clip_after_step",
        (
            r"clip_grad",
        ),
        {},
        (),
    ),
    "TC214": (
        "amp.tc214_accumulation_loss_not_divided",
        (
            (r"\.\s*backward\b", r"\.\s*step\s*\(", r"%", r"zero_grad"),
        ),
        {},
        (),
    ),
    "TC215": (
        "amp.tc215_framework_fp32_training",
        (
            r"Trainer(?<!\wTrainer)\b|TrainingArguments|SFTConfig|HfArgumentParser|Accelerator(?<!\wAccelerator)\b|LightningCLI",
        ),
        {},
        (),
    ),
    "TC301": (
        "compile.tc301_tf32_disabled",
        (
            (r"\.\s*backward\b", '\\bcuda\\b|torch\\.accelerator\\b|[\\"\']gpu[\\"\']|device|gpu|rank|\\.to\\(\\s*\\d'),
            r"Trainer(?<!\wTrainer)\b|TrainingArguments|SFTConfig|HfArgumentParser|LightningCLI",
        ),
        {},
        (),
    ),
    "TC302": (
        "compile.tc302_cudnn_benchmark_off",
        (
            (r"\.\s*backward\b", '\\bcuda\\b|torch\\.accelerator\\b|[\\"\']gpu[\\"\']|device|gpu|rank|\\.to\\(\\s*\\d'),
        ),
        {},
        (),
    ),
    "TC303": (
        "compile.tc303_channels_last_missing",
        (
            (r"\.\s*backward\b", '\\bcuda\\b|torch\\.accelerator\\b|[\\"\']gpu[\\"\']|device|gpu|rank|\\.to\\(\\s*\\d'),
        ),
        {},
        (),
    ),
    "TC304": (
        "compile.tc304_legacy_jit_flags",
        (
            r"_jit_|graph_executor_optimize",
        ),
        {},
        (),
    ),
    "TC305": (
        "compile.tc305_not_compiled",
        (
            (r"\.\s*backward\b", '\\bcuda\\b|torch\\.accelerator\\b|[\\"\']gpu[\\"\']|device|gpu|rank|\\.to\\(\\s*\\d'),
            r"TrainingArguments|SFTConfig|HfArgumentParser",
            (r"LightningModule", r"\.fit\("),
        ),
        {},
        (),
    ),
    "TC306": (
        "compile.tc306_debug_mode_on",
        (
            r"anomaly|profile|nvtx|emit_itt|gradcheck|CUDA_LAUNCH_BLOCKING",
        ),
        {},
        (),
    ),
    "TC307": (
        "compile.tc307_unfused_optimizer",
        (
            (r"Adam|SGD", r"\.\s*backward\b", '\\bcuda\\b|torch\\.accelerator\\b|[\\"\']gpu[\\"\']|device|gpu|rank|\\.to\\(\\s*\\d'),
            r"adamw_torch\b|adamw_hf|adamw_torch_foreach",
            (r"Adam", r"configure_optimizers"),
        ),
        {},
        (),
    ),
    "TC308": (
        "compile.tc308_manual_attention",
        (
            (r"softmax", r"transpose(?<!\wtranspose)\b|\.mT\b", r"@|matmul"),
        ),
        {},
        (),
    ),
    "TC309": (
        "compile.tc309_deterministic_kernels",
        (
            (r"deterministic\s*=|benchmark\s*=|use_deterministic_algorithms", r"\.\s*backward\b", '\\bcuda\\b|torch\\.accelerator\\b|[\\"\']gpu[\\"\']|device|gpu|rank|\\.to\\(\\s*\\d'),
        ),
        {},
        (),
    ),
    "TC310": (
        "compile.tc310_graph_break_in_forward",
        (
            (r"def forward", r"compile(?<!\wcompile)(?<!\bre\.compile)\b"),
        ),
        {
            "compile": (r"def forward",),
        },
        (),
    ),
    "TC311": (
        "compile.tc311_compile_in_loop",
        (
            (r"compile\(", r"\.backward\("),
        ),
        {},
        (),
    ),
    "TC312": (
        "compile.tc312_deprecated_sdp_kernel",
        (
            r"sdp_kernel",
        ),
        {},
        (),
    ),
    "TC313": (
        "compile.tc313_arch_list_variable",
        (
            r"TORCH_CUDA_ARCH_LIST",
        ),
        {},
        (),
    ),
    "TC314": (
        "compile.tc314_mha_need_weights",
        (
            r"MultiheadAttention",
        ),
        {},
        (),
    ),
    "TC315": (
        "compile.tc315_checkpoint_use_reentrant",
        (
            r"checkpoint",
        ),
        {},
        (),
    ),
    "TC316": (
        "compile.tc316_requires_grad_typo",
        (
            r"req\w*_g(?:rad|ard)",
        ),
        {},
        (),
    ),
    "TC317": (
        "compile.tc317_torch_load_weights_only",
        (
            r"load(?<!\wload)\b",
        ),
        {},
        (),
    ),
    "TC318": (
        "compile.tc318_compile_partial_batch",
        (
            (r"DataLoader", r"compile(?<!\wcompile)\b", r"\.\s*(?:backward|step)\b", 'mps\\b|\\bxpu\\b|FloatTensor|HalfTensor|\\bcuda\\b|torch\\.accelerator\\b|[\\"\']gpu[\\"\']|device|gpu|rank|\\.to\\(\\s*\\d'),
        ),
        {
            "compile": ((r"DataLoader", r"\.\s*(?:backward|step)\b", 'mps\\b|\\bxpu\\b|FloatTensor|HalfTensor|\\bcuda\\b|torch\\.accelerator\\b|[\\"\']gpu[\\"\']|device|gpu|rank|\\.to\\(\\s*\\d'),),
        },
        (),
    ),
    "TC401": (
        "pipeline.tc401_dataloader_no_workers",
        (
            ('mps\\b|\\bxpu\\b|FloatTensor|HalfTensor|\\bcuda\\b|torch\\.accelerator\\b|[\\"\']gpu[\\"\']|device|gpu|rank|\\.to\\(\\s*\\d', r"\.\s*(?:backward|step)\b|lightning|accelerate|deepspeed|apex|colossalai|composer|MixedPrecision|Trainer"),
            r"TrainingArguments|SFTConfig|HfArgumentParser",
        ),
        {},
        (r"DataLoader\(",),
    ),
    "TC402": (
        "pipeline.tc402_dataloader_no_pin_memory",
        (
            ('\\bcuda\\b|torch\\.accelerator\\b|[\\"\']gpu[\\"\']|device|gpu|rank|\\.to\\(\\s*\\d', r"\.\s*(?:backward|step)\b|lightning|accelerate|deepspeed|apex|colossalai|composer|MixedPrecision|Trainer"),
        ),
        {},
        (r"DataLoader\(",),
    ),
    "TC403": (
        "pipeline.tc403_blocking_h2d_copy",
        (
            (r"DataLoader", r"\.\s*backward\b", '\\bcuda\\b|torch\\.accelerator\\b|[\\"\']gpu[\\"\']|device|gpu|rank|\\.to\\(\\s*\\d'),
        ),
        {},
        (),
    ),
    "TC404": (
        "pipeline.tc404_workers_not_persistent",
        (
            (r"DataLoader", 'mps\\b|\\bxpu\\b|FloatTensor|HalfTensor|\\bcuda\\b|torch\\.accelerator\\b|[\\"\']gpu[\\"\']|device|gpu|rank|\\.to\\(\\s*\\d', r"\.\s*(?:backward|step)\b|lightning|accelerate|deepspeed|apex|colossalai|composer|MixedPrecision|Trainer"),
        ),
        {},
        (),
    ),
    "TC405": (
        "pipeline.tc405_cpu_image_decode",
        (
            (r"ImageFolder|ImageNet|PIL|cv2|read_image|decode_image|decode_jpeg|imread|imageio|skimage", '\\bcuda\\b|torch\\.accelerator\\b|[\\"\']gpu[\\"\']|device|gpu|rank|\\.to\\(\\s*\\d', r"\.\s*(?:backward|step)\b|lightning|accelerate|deepspeed|apex|colossalai|composer|MixedPrecision|Trainer"),
        ),
        {},
        (),
    ),
    "TC406": (
        "pipeline.tc406_tensor_created_then_moved",
        (
            (r"\.(?:cuda|to)\b", r"\bcuda\b|torch\.accelerator|\bmps\b|\bxpu\b|FloatTensor|HalfTensor", r"\b(?:zeros|ones|empty|full|rand\w*|arange|linspace|logspace|eye|tensor|as_tensor|\w+_like|tril_indices|triu_indices)\("),
        ),
        {},
        (),
    ),
    "TC407": (
        "pipeline.tc407_dali_pipeline_without_input",
        (
            r"pipeline_def",
        ),
        {},
        (),
    ),
    "TC408": (
        "pipeline.tc408_host_tensors_copied_each_step",
        (
            (r"\.(?:cuda|to)\b", r"\.\s*backward\b", '\\bcuda\\b|torch\\.accelerator\\b|[\\"\']gpu[\\"\']|device|gpu|rank|\\.to\\(\\s*\\d'),
        ),
        {},
        (),
    ),
    "TC409": (
        "pipeline.tc409_d2h_non_blocking_read",
        (
            (r"non_blocking", r"\.\s*(?:to|copy_)\b", '\\bcuda\\b|torch\\.accelerator\\b|[\\"\']gpu[\\"\']|device|gpu|rank|\\.to\\(\\s*\\d'),
        ),
        {},
        (),
    ),
    "TC410": (
        "pipeline.tc410_dataset_rng_shared_by_workers",
        (
            (r"DataLoader", r"__getitem__", r"default_rng|RandomState|Random|Generator", r"\.\s*(?:backward|step)\b|lightning|accelerate|deepspeed|apex|colossalai|composer|MixedPrecision|Trainer"),
        ),
        {},
        (),
    ),
    "TC411": (
        "pipeline.tc411_images_normalized_on_host",
        (
            (r"ToTensor", '\\bcuda\\b|torch\\.accelerator\\b|[\\"\']gpu[\\"\']|device|gpu|rank|\\.to\\(\\s*\\d', r"\.\s*(?:backward|step)\b|lightning|accelerate|deepspeed|apex|colossalai|composer|MixedPrecision|Trainer"),
        ),
        {},
        (),
    ),
    "TC412": (
        "pipeline.tc412_collator_pad_multiple",
        (
            r"DataCollator(?:WithPadding|ForSeq2Seq|ForTokenClassification|ForLanguageModeling|ForMultipleChoice)",
        ),
        {},
        (),
    ),
    "TC413": (
        "pipeline.tc413_ragged_batches_ungrouped",
        (
            (r"TrainingArguments|SFTConfig|HfArgumentParser|Trainer\b", r"DataCollator(?:WithPadding|ForSeq2Seq|ForTokenClassification)"),
        ),
        {},
        (),
    ),
    "TC501": (
        "distributed.tc501_dataparallel",
        (
            r"DataParallel(?<!DistributedDataParallel)",
        ),
        {},
        (),
    ),
    "TC502": (
        "distributed.tc502_ddp_bucket_view",
        (
            r"DistributedDataParallel",
        ),
        {},
        (),
    ),
    "TC503": (
        "distributed.tc503_ddp_without_distributed_sampler",
        (
            r"DistributedDataParallel|FullyShardedDataParallel|fully_shard",
        ),
        {},
        (r"DataLoader\(",),
    ),
    "TC504": (
        "distributed.tc504_sampler_without_set_epoch",
        (
            (r"DistributedSampler", r"\.\s*(?:backward|step)\b"),
            (r"DistributedDataParallel|FullyShardedDataParallel|fully_shard", r"\.\s*(?:backward|step)\b"),
        ),
        {},
        (),
    ),
    "TC505": (
        "distributed.tc505_single_process_training",
        (
            ('\\bcuda\\b|torch\\.accelerator\\b|[\\"\']gpu[\\"\']|device|gpu|rank|\\.to\\(\\s*\\d', r"\.\s*backward\b", r"\.\s*step\b"),
            r"Trainer\b|LightningCLI",
        ),
        {},
        (),
    ),
    "TC506": (
        "distributed.tc506_gloo_on_cuda",
        (
            r"gloo",
        ),
        {},
        (),
    ),
    "TC507": (
        "distributed.tc507_ddp_accumulation_sync",
        (
            r"DistributedDataParallel",
        ),
        {},
        (),
    ),
    "TC508": (
        "distributed.tc508_find_unused_parameters",
        (
            r"find_unused_parameters",
        ),
        {},
        (),
    ),
    "TC509": (
        "distributed.tc509_batchnorm_small_per_gpu_batch",
        (
            (r"DistributedDataParallel", r"DataLoader", r"BatchNorm|resne|densenet|efficientnet|mobilenet|regnet|mnasnet|shufflenet|inception|googlenet|vgg|get_model|create_model|__dict__|getattr"),
        ),
        {},
        (),
    ),
    "TC510": (
        "distributed.tc510_collective_in_rank_branch",
        (
            r"(?:a(?<!\wa)ll_(?:reduce|gather\w*|to_all\w*)|r(?<!\wr)educe(?:_scatter\w*)?|b(?<!\wb)(?:roadcast\w*|arrier)|m(?<!\wm)onitored_barrier|g(?<!\wg)ather\w*|s(?<!\ws)catter\w*)\(",
        ),
        {},
        (),
    ),
    "TC511": (
        "distributed.tc511_rank_zero_forward_through_ddp",
        (
            r"DistributedDataParallel",
        ),
        {},
        (),
    ),
    "TC513": (
        "distributed.tc513_uneven_rank_shards",
        (
            r"DistributedDataParallel",
        ),
        {},
        (),
    ),
    "TC514": (
        "distributed.tc514_process_group_timeout",
        (
            r"init_process_group",
        ),
        {},
        (),
    ),
    "TC515": (
        "distributed.tc515_checkpoint_saved_by_every_rank",
        (
            (r"torch\.save|\bsave\(", r"DistributedDataParallel", r"init_process_group"),
        ),
        {},
        (),
    ),
    "TC601": (
        "loop.tc601_per_step_sync",
        (
            r"\.backward\(|\.step\(|\b(fit|train)\w*\(|\blogging_steps\b|\blog_every_n_steps\b",
        ),
        {},
        (r"\.(item|cpu|numpy|tolist)\(|synchronize\(",),
    ),
    "TC602": (
        "loop.tc602_zero_grad_not_none",
        (
            r"set_to_none\s*=\s*False|zero_grad\(\s*False",
        ),
        {},
        (),
    ),
    "TC603": (
        "loop.tc603_loader_relisted",
        (
            r"list(?<!\wlist)\s*\([^)]*(?i:loader|dl)\b",
            (r"DataLoader", r"list(?<!\wlist)\s*\("),
        ),
        {},
        (),
    ),
    "TC604": (
        "loop.tc604_batch_size_unaligned",
        (
            r"(?is)\A(?=.*(?:\.backward\(|\.step\()).*(?:batch[-_]?size|bsz?\b)",
        ),
        {},
        (),
    ),
    "TC605": (
        "loop.tc605_empty_cache_in_loop",
        (
            r"empty_cache",
        ),
        {},
        (),
    ),
    "TC606": (
        "loop.tc606_eval_without_no_grad",
        (
            r"(?m)^[ \t]*(?:[^\n]*;[ \t]*)?[\w.]+\.eval\(\)",
            (r"def _*(?:eval|valid|test|infer|predict|sample|generate)", r"(?<![\w.])\w*(?:model|net|Net|generator|discriminator|encoder|decoder|classifier|backbone)\w*\)?\s*\(|\.\s*(?:named_)?parameters\s*\(|\.eval\("),
        ),
        {},
        (),
    ),
}

# Each model rule's module (the TC1 rules' halves over the model audit's facts).
MODEL_RULE_TABLE = {
    "TC100": "graph.tc100_model_not_audited",
    "TC101": "graph.tc101_gemm_dim_unaligned",
    "TC102": "graph.tc102_conv_channels_unaligned",
    "TC103": "graph.tc103_stem_conv_channels",
    "TC104": "graph.tc104_vocab_unaligned",
    "TC105": "graph.tc105_batch_unaligned",
    "TC106": "graph.tc106_attention_head_dim",
    "TC107": "graph.tc107_rnn_size_unaligned",
    "TC108": "graph.tc108_fp8_candidate",
    "TC110": "graph.tc110_redundant_cast",
    "TC111": "graph.tc111_fp32_gemm",
    "TC112": "graph.tc112_conv_bias_before_norm",
}
