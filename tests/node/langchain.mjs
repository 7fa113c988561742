// Three turns with LangChain.js's ChatOpenAI against the gateway, as a stateless app writes them:
// each call resends the whole history and no session hint. Turn 2 streams (`stream`, the chunks
// concatenated), turns 1 and 3 do not (`invoke`).
//
//   node langchain.mjs
//   env: AGW_BASE_URL (the gateway's /v1 URL), AGW_TOKEN, AGW_MODEL
//
// Prints one JSON line per turn: {turn, text, usage}; exits 1 on an error.
import { HumanMessage, SystemMessage } from "@langchain/core/messages";
import { ChatOpenAI } from "@langchain/openai";

const { AGW_BASE_URL: baseURL, AGW_TOKEN: apiKey, AGW_MODEL: model } = process.env;
const chat = new ChatOpenAI({ model, apiKey, configuration: { baseURL }, maxRetries: 0, streamUsage: true });

const history = [new SystemMessage("Be brief.")];
const questions = ["first question", "second question", "third question"];
for (const [index, question] of questions.entries()) {
  history.push(new HumanMessage(question));
  let answer;
  if (index === 1) {
    for await (const chunk of await chat.stream(history)) answer = answer ? answer.concat(chunk) : chunk;
  } else {
    answer = await chat.invoke(history);
  }
  history.push(answer);
  console.log(JSON.stringify({ turn: index + 1, text: answer.text, usage: answer.usage_metadata ?? null }));
}
