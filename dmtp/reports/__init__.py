"""Tables and reports, in one place: the aligned table (tables), the decoding comparison of dmtp.infer
(decoding), the validation walk a training run ends with (walk) and the sweep aggregate (sweep).

Imports neither training nor the inference application: both import it."""
