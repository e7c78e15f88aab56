// The dataset card (README.md) written beside each exported dataset.
import { describeColumn, type Column } from '../../pipeline/parquet.ts';
import type { Lineage } from '../../pipeline/stage.ts';

export interface CardInput {
  name: string;
  title: string;
  purpose: string;
  howMade: string[];
  counts: Record<string, number>;
  columns: Record<string, Column>;
  configHash: string;
  lineage: Lineage[];
  madeAt: string;
}

export function datasetCard(c: CardInput): string {
  const rows = Object.entries(c.counts).map(([k, v]) => `| ${k} | ${v} |`);
  const schema = Object.entries(c.columns).map(([k, col]) => `| \`${k}\` | \`${describeColumn(col).replace(/\|/g, '\\|')}\` |`);
  const lineage = c.lineage.map((l) => `| ${l.stage} | ${l.code_version} | \`${l.config_hash.slice(0, 16)}\` | \`${l.fingerprint.slice(0, 16)}\` | ${l.finished_at} |`);
  return `# prefab dataset: ${c.title}

${c.purpose}

## Counts

| split | rows |
|---|---|
${rows.join('\n')}

## Schema

\`?\` marks a nullable column. Messages are OpenAI chat messages, kept losslessly.

| column | type |
|---|---|
${schema.join('\n')}

## How it was made

${c.howMade.map((l) => `- ${l}`).join('\n')}

Config hash (every stage that led here): \`${c.configHash}\`. Made ${c.madeAt}.

| stage | code | config hash | output fingerprint | finished |
|---|---|---|---|---|
${lineage.join('\n')}

## Loading it

\`\`\`python
from datasets import load_dataset
ds = load_dataset("parquet", data_files={"train": "train.parquet", "test": "test.parquet"})
\`\`\`

\`\`\`sql
-- DuckDB
SELECT * FROM 'train.parquet' LIMIT 5;
\`\`\`
`;
}
