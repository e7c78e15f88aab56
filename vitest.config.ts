import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    // Whole stages and training runs in one test: minutes on a shared 2-core machine (as `npm test` and a
    // single file run alike).
    testTimeout: 180_000,
    hookTimeout: 180_000,
    // One temporary root for the run, removed at its end (test/fixtures/temp-root.ts).
    globalSetup: ['test/fixtures/temp-root.ts'],
  },
});
