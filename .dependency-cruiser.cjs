// The walls between prefab's rooms (docs/architecture.md), checked by `npm run lint:deps` in CI.
// An import may go down the list below, never up: bin → report → stages → loop → rl / pairing → judges → env / trainers → runtime → model / store → core → pipeline.
/** @type {import('dependency-cruiser').IConfiguration} */
module.exports = {
  forbidden: [
    {
      name: 'no-cycles',
      severity: 'error',
      comment:
        "No import cycles anywhere: each room reads as a layer. Type-only imports do not count (they are gone at run time): a stage's run.ts takes its Config type from the index.ts that loads it (dependency-cruiser #695: preCompilationOnly false is its way to say so).",
      from: {},
      to: { circular: true, preCompilationOnly: false, viaOnly: { dependencyTypesNot: ['type-only'] } },
    },
    {
      name: 'engine-knows-no-domain',
      severity: 'error',
      comment: 'pipeline/ is the engine: stages, manifests, workspace, config, CLI. It imports nothing of the domain.',
      from: { path: '^pipeline/' },
      to: { path: '^(core|store|pairing|stages|judges|env|model|trainers|runtime|rl|loop|bin)/' },
    },
    {
      name: 'core-imports-nothing-of-ours',
      severity: 'error',
      comment: "core/ is what everything shares; it imports no other room (only the engine's one hash function).",
      from: { path: '^core/' },
      to: { path: '^(store|pairing|stages|judges|env|model|trainers|runtime|rl|loop|bin)/|^pipeline/(?!hash\\.ts$)' },
    },
    {
      name: 'store-imports-core-and-engine-only',
      severity: 'error',
      comment:
        'The session store is the bytes ingest and split write, read back: it knows records and the engine, not what the stages make of them.',
      from: { path: '^store/' },
      to: { path: '^(stages|pairing|judges|env|model|trainers|runtime|loop|bin)/' },
    },
    {
      name: 'pairing-is-a-library',
      severity: 'error',
      comment:
        "Pair builders (outcome, hard negatives, the rewriter, a bucket made into pairs): the pairs stage wires them, as stages wire judges/. They read the store and may ask a judge; they know no simulator (a session's tools come with it), stage, trainer or loop.",
      from: { path: '^pairing/' },
      to: { path: '^(stages|env|model|trainers|runtime|rl|loop|bin)/' },
    },
    {
      name: 'only-the-stages-use-pairing',
      severity: 'error',
      comment: 'Judges, the simulator, the trainer and the loop know nothing of how pairs are built.',
      from: { path: '^(pipeline|core|store|judges|env|model|trainers|runtime|loop)/' },
      to: { path: '^pairing/' },
    },
    {
      name: 'only-the-data-stages-read-the-store',
      severity: 'error',
      comment:
        'The store lies below the stages and the pair builders; judges, the simulator, the trainer and the loop take records, never stored bytes.',
      from: { path: '^(pipeline|core|judges|env|model|trainers|runtime|loop)/' },
      to: { path: '^store/' },
    },
    {
      name: 'env-imports-core-and-engine-only',
      severity: 'error',
      comment: 'The simulator is a world of its own: it knows records, not stages, judges or the trainer.',
      from: { path: '^env/' },
      to: { path: '^(stages|judges|model|trainers|runtime|loop|bin)/' },
    },
    {
      name: 'judges-import-no-stage-or-trainer',
      severity: 'error',
      comment: 'Judges decide comparisons; the stages wire them. The verifier may replay in env/.',
      from: { path: '^judges/' },
      to: { path: '^(stages|model|trainers|runtime|loop|bin)/' },
    },
    {
      name: 'the-model-is-a-library',
      severity: 'error',
      comment:
        'model/ is the Llama as a reader meets it (the reference model, its config, Hugging Face folders and PEFT, tokenizer and chat templates): it knows no device, trainer, stage, judge or simulator.',
      from: { path: '^model/' },
      to: { path: '^(stages|judges|env|trainers|runtime|rl|loop|bin)/' },
    },
    {
      name: 'the-runtime-runs-models-only',
      severity: 'error',
      comment:
        "runtime/ runs a model where the device says (the CPU path's C kernels, the GPU's WGSL, the reference): forward and backward passes, scoring, decoding, placement. It knows models, not how they are trained (trainers/) or what plays them (rl/, env/); a policy meets the simulator through core's Policy.",
      from: { path: '^runtime/' },
      to: { path: '^(stages|judges|env|trainers|rl|loop|bin)/' },
    },
    {
      name: 'engines-stand-apart',
      severity: 'error',
      comment:
        'Each engine (runtime/cpu/, runtime/webgpu/) is checked against the reference model on its own: neither imports the other. What chooses between them (device.ts, placement.ts) sits above both in runtime/.',
      from: { path: '^runtime/(cpu|webgpu)/' },
      to: { path: '^runtime/(cpu|webgpu)/', pathNot: '^runtime/$1/' },
    },
    {
      name: 'trainers-use-the-model-and-the-runtime',
      severity: 'error',
      comment:
        'trainers/ (the shared run, sft, dpo, kto, the losses) train a model on a device: no stage, judge, simulator or loop. RL, which needs the simulator, lives in rl/.',
      from: { path: '^trainers/' },
      to: { path: '^(stages|judges|env|rl|loop|bin)/' },
    },
    {
      name: 'rl-uses-the-trainer-and-the-world',
      severity: 'error',
      comment:
        "Reinforcement learning (rollouts, feedback notes, the DAPO trainer and its run, iterative DPO) plays the trainers' policy in the simulator; the dapo stage and a refresh night call it. It may build pairs from its rollouts (pairing/steps.ts), which read no store.",
      from: { path: '^rl/' },
      to: { path: '^(stages|store|judges|loop|bin)/|^pairing/(?!steps\\.ts$)' },
    },
    {
      name: 'nothing-below-rl-imports-it',
      severity: 'error',
      comment:
        'The trainer and the simulator know nothing of each other; only rl/ brings them together, and only stages and the loop call it.',
      from: { path: '^(pipeline|core|store|pairing|judges|env|model|trainers|runtime)/' },
      to: { path: '^rl/' },
    },
    {
      name: 'loop-imports-no-stage',
      severity: 'error',
      comment:
        'loop/ (the online refresh loop: registry, serving, nights) runs what the stages made, and DAPO through rl/; it never reaches into a stage.',
      from: { path: '^loop/' },
      to: { path: '^(stages|bin)/' },
    },
    {
      name: 'no-stage-imports-another-stage',
      severity: 'error',
      comment:
        "What passes between stages on disk is stages/layout.ts (the sessions in it read through store/); a stage never reaches into another stage's folder.",
      from: { path: '^stages/([^/]+)/' },
      to: { path: '^stages/([^/]+)/', pathNot: '^stages/$1/' },
    },
    {
      name: 'only-the-registry-imports-stages',
      severity: 'error',
      comment:
        'stages/index.ts lists the stages (bin/commands.ts adds their preview command); nothing below bin/ imports a stage.',
      from: { path: '^(pipeline|core|store|pairing|judges|env|model|trainers|runtime|rl|loop)/' },
      to: { path: '^stages/' },
    },
    {
      name: 'bin-starts-the-cli-only',
      severity: 'error',
      comment:
        'The executable hands the command line to the CLI with the stages and the command list; everything else lives below it.',
      from: { path: '^bin/prefab\\.js$' },
      to: {
        path: '^(pipeline|core|store|pairing|judges|env|model|trainers|runtime|rl|loop|report|stages)/',
        pathNot: '^(pipeline/cli|stages/index)\\.ts$',
      },
    },
    {
      name: 'only-the-command-list-imports-the-report',
      severity: 'error',
      comment:
        'report/ reads what every room wrote (a view of the workspace): bin/commands.ts adds its command, and nothing else knows it, so no arrow climbs from the stages it reads up to it.',
      from: { path: '^(?!bin/commands\\.ts$|report/|test/)' },
      to: { path: '^report/' },
    },
    {
      name: 'the-page-script-is-the-browsers',
      severity: 'error',
      comment:
        "report/client/ runs in the browser: it takes the page's data types and uPlot, nothing of Node or prefab.",
      from: { path: '^report/client/' },
      to: { path: '^(?!report/(client/|data\\.ts$)|node_modules/uplot/)' },
    },
    {
      name: 'no-orphans',
      severity: 'error',
      comment: 'A source file nothing imports is dead (tests and benches are entry points).',
      from: {
        orphan: true,
        pathNot: ['^(test|bench|bin)/', '\\.d\\.ts$', '^\\.dependency-cruiser\\.cjs$', '^knip\\.json$'],
      },
      to: {},
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    exclude: { path: '^(node_modules|workspace|data)/' },
    tsPreCompilationDeps: true,
    parser: 'swc',
    enhancedResolveOptions: { extensions: ['.ts', '.js'] },
  },
};
