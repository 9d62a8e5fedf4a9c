export async function realConfirmation(_opts: { quick: boolean }): Promise<void> {}
