"""The enumerations a config chooses from, torch-free.

The config validator (:mod:`dpsub.config`) and the code that implements each choice import
them from here, so a value the validator accepts always has an implementation (tests
check each registry against its enumeration).
"""

#: ``grads.backend``: strategies in :data:`dpsub.grads.engine.BACKEND_CLASSES`.
BACKENDS = ("vmap", "opacus", "ghost")
#: ``privacy.sampling``: :func:`dpsub.privacy.sampling.build_sampler`.
SAMPLINGS = ("poisson", "shuffle")
#: ``privacy.accountant``: :mod:`dpsub.privacy.accountants`.
ACCOUNTANTS = ("rdp", "prv")
#: ``privacy.rng``: seeded (reproducible) or secure (``os.urandom``) randomness.
RNGS = ("seeded", "secure")
#: ``Mechanism.accounting``: :mod:`dpsub.privacy.run_account`.
POLICIES = ("planned", "measured", "nominal")
#: ``features.name``: frozen feature extractors (:mod:`dpsub.features.extractors`).
FEATURES = (
    "none", "scatternet", "cifar100_resnet", "torchscript", "exported",
    "efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2",
)  # fmt: skip
#: ``features.name``s whose model is a user's file (``features.path``) -> what saved it
MODEL_FILES = {"torchscript": "torch.jit.save", "exported": "torch.export.save"}
#: ``features.norm``: where the feature normalization comes from (:mod:`dpsub.features`).
FEATURE_NORMS = ("public", "example", "none")
