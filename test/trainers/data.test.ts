// How a preference pair becomes two sequences: one cut of the prompt for both sides, room left for the longer
// side, and a pair that cannot fit left out with its reason instead of silently cut.
import { describe, expect, it } from 'vitest';
import type { Message, Pair } from '../../core/records.ts';
import { renderText } from '../../model/chat-template.ts';
import { completionSequences } from '../../trainers/data.ts';
import { pairExamples } from '../../trainers/dpo.ts';
import { prefabChat } from '../../model/chat.ts';
import { trainTokenizer } from '../../model/tokenizer.ts';

const system: Message = { role: 'system', content: 'You call companies for the user.' };
const request: Message = { role: 'user', content: 'Please cancel my gym membership.' };
/** Earlier turns of the conversation: what the prompt may drop to make room. */
const history: Message[] = Array.from({ length: 6 }, (_, i) => [
  { role: 'assistant', content: `Step ${i}: I looked this up for you.` } as Message,
  { role: 'user', content: `Thanks, what about step ${i + 1}?` } as Message,
]).flat();
const prompt = [system, request, ...history];
const short: Message[] = [{ role: 'assistant', content: 'Done.' }];
const verbose: Message[] = [
  {
    role: 'assistant',
    content: 'Certainly! I am so glad to help. '.repeat(12) + 'Done, as you asked, and thank you for your patience.',
  },
];

const tokenizer = prefabChat(
  trainTokenizer([renderText([...prompt, ...short]), renderText([...prompt, ...verbose])], 300),
);
const trained = (mask: number[]) => mask.reduce((n, m) => n + m, 0);

describe('pair sequences', () => {
  it('cuts the prompt to leave room for the longer side, so neither side loses its end', async () => {
    const whole = await completionSequences(tokenizer, prompt, [short, verbose], 10_000, null);
    if ('tooLong' in whole) throw new Error(whole.tooLong);
    const verboseTokens = trained(whole[1]!.mask);
    // Room for the verbose side and a little of the history, not for all of it.
    const length = whole[1]!.ids.length - 20;
    const cut = await completionSequences(tokenizer, prompt, [short, verbose], length, null);
    if ('tooLong' in cut) throw new Error(cut.tooLong);
    const [c, r] = cut;
    expect(r!.ids.length).toBeLessThanOrEqual(length);
    expect(trained(r!.mask)).toBe(verboseTokens);
    expect(trained(c!.mask)).toBe(trained(whole[0]!.mask));
    // Both sides read the same prompt.
    const promptTokens = c!.mask.indexOf(1);
    expect(r!.ids.slice(0, promptTokens)).toEqual(c!.ids.slice(0, promptTokens));
    expect(promptTokens).toBeLessThan(whole[0]!.mask.indexOf(1));
  });

  it('leaves a pair out, with its reason, when a side does not fit even after the head of the prompt', async () => {
    const pair = (id: string, rejected: Message[]): Pair => ({
      pair_id: id,
      prompt,
      chosen: short,
      rejected,
      chosen_reward: 1,
      rejected_reward: 0,
      margin: 1,
      confidence: 1,
      source: 'hard_negative',
      negative_type: 'verbose',
      judge: 'verifier',
      task_id: 't',
      chosen_session_id: 'a',
      rejected_session_id: 'b',
      split: 'train',
    });
    const head = await completionSequences(tokenizer, [system, request], [verbose], 10_000, null);
    if ('tooLong' in head) throw new Error(head.tooLong);
    const length = head[0]!.ids.length - 5;
    const made = await pairExamples(tokenizer, [pair('fits', short), pair('too-long', verbose)], length, null);
    expect(made.examples).toHaveLength(1);
    expect(made.rows).toEqual([0]);
    expect(made.dropped).toEqual([
      {
        row: 1,
        reason: expect.stringMatching(
          /^completion 2 needs \d+ tokens with the prompt's head, more than the \d+ allowed$/,
        ),
      },
    ]);
  });
});
