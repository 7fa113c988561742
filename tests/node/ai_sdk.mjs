// Three turns with the Vercel AI SDK 6 against the gateway, as a stateless app writes them: each
// call resends the whole history (`messages` plus the previous `response.messages`) and no session
// hint. Turn 2 streams (streamText), turns 1 and 3 do not (generateText).
//
//   node ai_sdk.mjs openai-compatible|openai|openai-chat
//   env: AGW_BASE_URL (the gateway's /v1 URL), AGW_TOKEN, AGW_MODEL
//
// Prints one JSON line per turn: {turn, text, usage, session}; exits 1 on an error.
import { createOpenAI } from "@ai-sdk/openai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateText, streamText } from "ai";

const [provider] = process.argv.slice(2);
const { AGW_BASE_URL: baseURL, AGW_TOKEN: apiKey, AGW_MODEL: modelId } = process.env;

function pickModel() {
  if (provider === "openai-compatible") {
    // includeUsage asks for the stream's usage chunk (stream_options.include_usage)
    return createOpenAICompatible({ name: "agent-gateway", baseURL, apiKey, includeUsage: true })(modelId);
  }
  const openai = createOpenAI({ baseURL, apiKey });
  if (provider === "openai") return openai(modelId); // the Responses API, the provider's default
  if (provider === "openai-chat") return openai.chat(modelId);
  throw new Error(`unknown provider ${provider}`);
}

const model = pickModel();
const messages = [{ role: "system", content: "Be brief." }];
const questions = ["first question", "second question", "third question"];
for (const [index, question] of questions.entries()) {
  messages.push({ role: "user", content: question });
  let text, usage, response;
  if (index === 1) {
    let failure = null;
    const result = streamText({ model, messages, maxRetries: 0, onError: ({ error }) => (failure = error) });
    text = "";
    for await (const delta of result.textStream) text += delta;
    if (failure) throw failure;
    [usage, response] = await Promise.all([result.usage, result.response]);
  } else {
    const result = await generateText({ model, messages, maxRetries: 0 });
    ({ text, usage, response } = result);
  }
  messages.push(...response.messages);
  const session = response.headers?.["x-agent-gateway-session"] ?? null;
  console.log(JSON.stringify({ turn: index + 1, text, usage, session }));
}
