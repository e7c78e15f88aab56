import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    // One temporary root for the run, removed at its end (test/fixtures/temp-root.ts).
    globalSetup: ['test/fixtures/temp-root.ts'],
  },
});
